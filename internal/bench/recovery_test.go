package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/internal/testcluster"
)

// The recovery benchmark runs agents as processes of the rewind binary,
// built once per test binary and removed when the tests end; the
// coordinator benchmark runs its simulated agents as this binary in the
// role coordinator-agents.
func TestMain(m *testing.M) {
	testcluster.Main(m, map[string]testcluster.Role{"coordinator-agents": func() int {
		if err := CoordAgentsMain(context.Background(), os.Args[1:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}})
}

// The recovery benchmark's plumbing: a small state, one run; the event
// arrives and every figure is positive. Its figures come from `make bench`.
func TestRecoveryBenchRuns(t *testing.T) {
	shmDir, err := os.MkdirTemp("/dev/shm", "rewind-test-")
	if err != nil {
		t.Skipf("the agents need /dev/shm: %v", err)
	}
	defer os.RemoveAll(shmDir)
	bin := testcluster.Binary(t, testcluster.RewindPackage)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var log strings.Builder
	res, err := Recovery(ctx, RecoveryConfig{Binary: bin, Size: 8 << 20, Runs: 1, Steps: 2, DataDir: t.TempDir(), ShmDir: shmDir, Out: &log})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Runs[0]
	if r.Killed == "" || r.Step != 2 || r.Detection <= 0 || r.Planning <= 0 || r.Movement <= 0 || r.Total < r.Detection ||
		r.PeerBytes < 8<<20 || r.Sources["shm:peer"] != 1 || r.Peer <= 0 || r.TCP <= 0 || r.TCPShm <= 0 || r.GRPCRead <= 0 || res.Ratio <= 0 {
		t.Fatalf("run %+v", r)
	}
	var b strings.Builder
	PrintRecovery(&b, res)
	t.Logf("%s\n%s", log.String(), b.String())
	for _, want := range []string{"kill to restored", "peer restore / loopback TCP", "< 2 s"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, b.String())
		}
	}
	if left, _ := os.ReadDir(shmDir); len(left) > 0 {
		t.Fatalf("shared memory left behind: %v", left)
	}
}
