package demo

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
)

// TestClusterDemo runs the cluster demo small: four agent processes and a
// coordinator with failure detection, a job of four ranks, one node
// SIGKILLed with its ranks and memory; the job must be recovered by
// failure detection alone and every rank resume and finish bit-identical
// to an uninterrupted run.
func TestClusterDemo(t *testing.T) {
	runClusterDemo(t, 1, []string{"all 9 checks passed"})
}

// TestClusterDemoTwoKills: two nodes die one after the other, each at a
// seeded random point of a step (during a save, a replication or a tier
// copy); both recoveries resume from a step every rank had committed. It
// runs in metamorphic mode: the agents fail saves before their commit and
// tier uploads and writes at random, at rates drawn from the seed, and
// every check must pass all the same.
func TestClusterDemoTwoKills(t *testing.T) {
	runClusterDemo(t, 2, []string{"all 10 checks passed", "recovery 2 resumes from a step every rank had committed"}, randomFaults)
}

// randomFaults is a fault spec for the agents drawn from seed: failures
// the system must absorb (a save that fails is logged and training goes
// on; tier transfers are retried).
func randomFaults(seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, 0xfa17))
	return fmt.Sprintf("agent/shard-copied=%d%%error(EIO);agent/tier-uploaded=%d%%error(EIO);fs/tier/write=%d%%error(EIO);agent/restore-fetched=sleep(%dms)",
		1+rng.IntN(4), 5+rng.IntN(20), 1+rng.IntN(5), 1+rng.IntN(20))
}

func runClusterDemo(t *testing.T, kills int, wants []string, faults ...func(uint64) string) {
	exe := rewindBinary(t)
	var out bytes.Buffer
	cfg := DefaultClusterConfig()
	cfg.Exe, cfg.Seed, cfg.Out, cfg.NoMinIO, cfg.Kills = exe, testSeed(t), &out, true, kills
	cfg.KeepLogs = os.Getenv("REWIND_DEMO_KEEP_LOGS") != "" // to look into a failure
	for _, f := range faults {
		cfg.Faults = f(cfg.Seed)
		t.Logf("metamorphic mode: agents armed with %s", cfg.Faults)
	}
	cfg.Steps, cfg.Size, cfg.StepTime, cfg.KillMin, cfg.KillMax = 30, 1<<20, 50*time.Millisecond, 5, 9
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := RunCluster(ctx, cfg)
	text := out.String()
	if err != nil {
		t.Fatalf("cluster demo: %v\n%s", err, text)
	}
	for _, want := range append([]string{"dies: SIGKILL its agent", "declared dead", "restored", "rank 3 ends as an uninterrupted run"}, wants...) {
		if !strings.Contains(text, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, text)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if dir, ok := strings.CutPrefix(line[strings.LastIndex(line, "removed ")+1:], "removed "); ok {
			for _, d := range strings.Split(dir, " and ") {
				if _, err := os.Stat(d); err == nil {
					t.Fatalf("%s left behind", d)
				}
			}
		}
	}
}
