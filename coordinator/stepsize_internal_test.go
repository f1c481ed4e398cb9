package coordinator

import (
	"path/filepath"
	"runtime"
	"testing"
)

// TestAOneRankStepCostsOneCopy: a step that one rank of a job at the
// largest allowed world size commits (a partial or abandoned step, or a
// hostile agent's report of one record per step) costs the index about
// one copy, not a map sized for every rank. At the default limits a job
// may hold MaxStepsPerJob (1024) steps, and MaxJobs (10000) jobs: a map of
// MaxWorldSize (65536) entries per step is about 5 MiB, 5 GiB per job for
// 1024 one-record reports.
func TestAOneRankStepCostsOneCopy(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	defer c.Close()
	world := c.cfg.MaxWorldSize
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.state.RegisterJob("big", world, nil, &Changes{}); err != nil {
		t.Fatal(err)
	}
	const steps = 16
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for step := int64(1); step <= steps; step++ {
		rec := Record{Job: "big", Step: step, Rank: 0, WorldSize: world, Node: "n0", Sum: "s", Size: 1, State: CopyCommitted}
		if err := c.state.Apply(rec, &Changes{}); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if len(c.state.Jobs["big"].Steps) != steps {
		t.Fatalf("%d steps", len(c.state.Jobs["big"].Steps))
	}
	per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / steps
	t.Logf("%d bytes held per one-record step at world size %d", per, world)
	if per > 64<<10 {
		t.Fatalf("a one-record step at world size %d holds %d bytes (%.1f MiB): %d steps per job are %.1f GiB",
			world, per, float64(per)/(1<<20), c.cfg.MaxStepsPerJob, float64(per)*float64(c.cfg.MaxStepsPerJob)/(1<<30))
	}
}
