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
	runClusterDemo(t, []string{"all 9 checks passed", "rank 3 ends as an uninterrupted run"})
}

// TestClusterDemoTwoKills: two nodes die one after the other, each at a
// seeded random point of a step (during a save, a replication or a tier
// copy); both recoveries resume from a step every rank had committed. It
// runs in metamorphic mode: the agents fail saves before their commit and
// tier uploads and writes at random, at rates drawn from the seed, and
// every check must pass all the same.
func TestClusterDemoTwoKills(t *testing.T) {
	runClusterDemo(t, []string{"all 10 checks passed", "recovery 2 resumes from a step every rank had committed", "rank 3 ends as an uninterrupted run"},
		func(cfg *ClusterConfig) {
			cfg.Kills, cfg.Faults = 2, randomFaults(cfg.Seed)
			t.Logf("metamorphic mode: agents armed with %s", cfg.Faults)
		})
}

// TestClusterDemoElastic: three nodes of two ranks each, elastic down to
// two ranks; a node dies and no spare is left, so the job shrinks to the
// four ranks of the two live nodes, each of which restores its rows of
// the model by resharding the step the six saved (a part of it from the
// dead node's replicas), and ends with its rows of an uninterrupted run.
func TestClusterDemoElastic(t *testing.T) {
	runClusterDemo(t, []string{"all 10 checks passed", "the job shrinks from 6 ranks to 4", "resharded step", "rank 3 of 4 ends with its rows of an uninterrupted run"},
		func(cfg *ClusterConfig) { cfg.Nodes, cfg.Ranks, cfg.Elastic = 3, 6, 2 })
}

// randomFaults is a fault spec for the agents drawn from seed: failures
// the system must absorb (a save that fails is logged and training goes
// on; tier transfers are retried).
func randomFaults(seed uint64) string {
	rng := rand.New(rand.NewPCG(seed, 0xfa17))
	return fmt.Sprintf("agent/shard-copied=%d%%error(EIO);agent/tier-uploaded=%d%%error(EIO);fs/tier/write=%d%%error(EIO);agent/restore-fetched=sleep(%dms)",
		1+rng.IntN(4), 5+rng.IntN(20), 1+rng.IntN(5), 1+rng.IntN(20))
}

func runClusterDemo(t *testing.T, wants []string, opts ...func(*ClusterConfig)) {
	exe := rewindBinary(t)
	var out bytes.Buffer
	cfg := DefaultClusterConfig()
	cfg.Exe, cfg.Seed, cfg.Out, cfg.NoMinIO = exe, testSeed(t), &out, true
	cfg.KeepLogs = os.Getenv("REWIND_DEMO_KEEP_LOGS") != "" // to look into a failure
	cfg.Steps, cfg.Size, cfg.StepTime, cfg.KillMin, cfg.KillMax = 30, 1<<20, 50*time.Millisecond, 5, 9
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := RunCluster(ctx, cfg)
	text := out.String()
	if err != nil {
		t.Fatalf("cluster demo: %v\n%s", err, text)
	}
	for _, want := range append([]string{"dies: SIGKILL its agent", "declared dead", "restored"}, wants...) {
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
