package demo

import (
	"bytes"
	"context"
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
// copy); both recoveries resume from a step every rank had committed.
func TestClusterDemoTwoKills(t *testing.T) {
	runClusterDemo(t, 2, []string{"all 10 checks passed", "recovery 2 resumes from a step every rank had committed"})
}

func runClusterDemo(t *testing.T, kills int, wants []string) {
	exe := rewindBinary(t)
	var out bytes.Buffer
	cfg := DefaultClusterConfig()
	cfg.Exe, cfg.Seed, cfg.Out, cfg.NoMinIO, cfg.Kills = exe, testSeed(t), &out, true, kills
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
