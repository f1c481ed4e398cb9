package goodput

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"rewind.dev/rewind/internal/testcluster"
)

// The end-to-end test runs the real binaries, rewind-dev (the ranks) and
// rewind beside it, built once per test binary and removed when the tests
// end.
func TestMain(m *testing.M) { testcluster.Main(m, nil) }

// TestShortRun runs both configurations briefly on a real local cluster
// (three agent processes, a coordinator, three ranks; one node SIGKILLed)
// and checks the accounting: every rank's wall time is split into terms
// that add up to it, goodput lies in (0, 1], and the fault was injected
// and recovered from. A sanity test of the harness, not a measurement:
// nothing about the figures' size is asserted.
func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run skipped in -short mode")
	}
	if fi, err := os.Stat("/dev/shm"); err != nil || !fi.IsDir() {
		t.Skip("no /dev/shm on this host")
	}
	testcluster.Binary(t, testcluster.RewindPackage)
	var out bytes.Buffer
	cfg := DefaultConfig()
	cfg.Exe = testcluster.Binary(t, "rewind.dev/rewind/cmd/rewind-dev")
	cfg.Nodes, cfg.Ranks, cfg.Size, cfg.StepTime = 3, 3, 1<<20, 200*time.Millisecond
	cfg.Duration, cfg.FaultEvery, cfg.HealAfter, cfg.Grace, cfg.BaselineEvery = 12*time.Second, 10*time.Second, 5*time.Second, 30*time.Second, 5
	cfg.Faults, cfg.NoMinIO, cfg.Seed, cfg.Out = []FaultKind{FaultNodeKill}, true, 1, &out
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Terms) != 2 {
		t.Fatalf("%d configurations accounted, want 2", len(res.Terms))
	}
	for i, b := range res.Terms {
		mode := res.Records[i].Mode
		var sum time.Duration
		for _, d := range b.Terms {
			sum += d
		}
		// Means over three ranks: each rank's terms add up exactly.
		if d := sum - b.Wall; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("%s: terms add up to %v, wall is %v", mode, sum, b.Wall)
		}
		if g := b.Goodput(); g <= 0 || g > 1 {
			t.Errorf("%s: goodput %v, want in (0, 1]", mode, g)
		}
		rec := res.Records[i]
		if len(rec.Faults) != 1 || rec.Faults[0].Err != "" {
			t.Errorf("%s: faults %+v, want one node kill that worked", mode, rec.Faults)
		}
		if b.Recoveries < 1 {
			t.Errorf("%s: no recovery from the node kill", mode)
		}
	}
}
