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
	exe := rewindBinary(t)
	var out bytes.Buffer
	cfg := DefaultClusterConfig()
	cfg.Exe, cfg.Seed, cfg.Out, cfg.NoMinIO = exe, testSeed(t), &out, true
	cfg.Steps, cfg.Size, cfg.StepTime, cfg.KillMin, cfg.KillMax = 20, 1<<20, 50*time.Millisecond, 6, 10
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := RunCluster(ctx, cfg)
	text := out.String()
	if err != nil {
		t.Fatalf("cluster demo: %v\n%s", err, text)
	}
	for _, want := range []string{"dies: SIGKILL its agent", "declared dead", "restored", "all 8 checks passed", "rank 3 ends as an uninterrupted run"} {
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
