package agent

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/internal/promtest"
)

// TestJobBytesMetric: rewind_agent_shm_job_bytes follows each job's
// segments as they are prepared and refused past --job-budget, and
// rewind_agent_shm_job_budget_bytes is the cap.
func TestJobBytesMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := newBudgetAgent(t, 8<<20, 2<<20, func(cfg *Config) { cfg.Registry = reg })
	ctx := context.Background()
	const size = 768 << 10
	for rank := range uint32(2) {
		if _, err := a.Prepare(ctx, "a", rank, 4, 1, size); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Prepare(ctx, "a", 2, 4, 1, size); !errors.Is(err, ErrBudget) {
		t.Fatalf("a third segment past the job's 2 MiB: %v, want ErrBudget", err)
	}
	if _, err := a.Prepare(ctx, "b", 0, 1, 1, size); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"a": 2 * size, "b": size}
	if got := jobGauges(t, reg); len(got) != 2 || got["a"] != want["a"] || got["b"] != want["b"] {
		t.Fatalf("rewind_agent_shm_job_bytes = %v, want %v", got, want)
	}
}

// newBudgetAgent is an agent over a fresh shm root with the given node
// budget and job share.
func newBudgetAgent(t *testing.T, budget, share uint64, mod func(*Config)) *Agent {
	t.Helper()
	return localAgent(t, func(cfg *Config) {
		cfg.BudgetBytes, cfg.JobBudgetBytes, cfg.Registry = budget, share, prometheus.NewRegistry()
		if mod != nil {
			mod(cfg)
		}
	})
}

// TestJobShareEvictsOnlyItsOwnReplicas: a save short of both the node's
// budget and its job's share makes room from its own job's replicas, and
// job b's replica stays: b's giving way would free the node's budget but
// not a's share, and a's save would fail anyway.
func TestJobShareEvictsOnlyItsOwnReplicas(t *testing.T) {
	for range 8 { // the agent walks ranks in map order: each round another order
		jobShareEvictsOnlyItsOwnReplicas(t)
	}
}

func jobShareEvictsOnlyItsOwnReplicas(t *testing.T) {
	const s = 768 << 10
	a := newBudgetAgent(t, 9*s/2, 7*s/2, nil)
	ctx := context.Background()
	for _, p := range []struct {
		job   string
		rank  uint32
		place bool
	}{{"a", 0, true}, {"a", 1, true}, {"a", 5, false}, {"b", 0, false}} {
		if _, err := a.prepare(ctx, p.job, p.rank, 8, 1, s, p.place, false, 0, false); err != nil {
			t.Fatalf("%s rank %d: %v", p.job, p.rank, err)
		}
	}
	if _, err := a.Prepare(ctx, "a", 2, 8, 1, s); err != nil {
		t.Fatalf("a's save with its own replica to give way: %v", err)
	}
	if n := len(a.rank("b", 0, false).slots); n != 1 {
		t.Fatalf("job b's replica was evicted for job a's save (%d slots left)", n)
	}
	if n := len(a.rank("a", 5, false).slots); n != 0 {
		t.Fatalf("job a's own replica is still there (%d slots): nothing gave way", n)
	}
}

// TestRefusedSaveGivesBackTheWarmSegment: a restore's save that adopts the
// warm segment and is then refused by its job's share leaves the warm
// segment ready for the next one, counted once, and no file at the slot.
func TestRefusedSaveGivesBackTheWarmSegment(t *testing.T) {
	const w = 2 << 20
	a := newBudgetAgent(t, 16<<20, 1<<20, func(cfg *Config) { cfg.WarmSegment = w })
	a.fillWarm()
	if a.warm.m == nil {
		t.Fatal("no warm segment")
	}
	ctx := context.Background()
	_, err := a.prepare(ctx, "a", 0, 1, 1, w, true, true, 0, false)
	if !errors.Is(err, ErrBudget) {
		t.Fatalf("a 2 MiB save in a 1 MiB share: %v, want ErrBudget", err)
	}
	if a.warm.m == nil || len(a.warm.adopted) != 0 {
		t.Fatalf("the warm segment is not ready again (adopted: %d)", len(a.warm.adopted))
	}
	if _, err := os.Stat(a.warm.path); err != nil {
		t.Fatalf("the warm segment's file: %v", err)
	}
	if _, err := os.Stat(a.paths.Segment("a", 0, 0)); !os.IsNotExist(err) {
		t.Fatalf("a file is left at the refused slot: %v", err)
	}
	if used, _ := a.Used(); used != w || len(a.jobBytes()) != 0 {
		t.Fatalf("in use %d bytes, by jobs %v; want the warm segment's %d alone", used, a.jobBytes(), w)
	}
}

func jobGauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	s := promtest.Samples(t, reg)
	if v := s["rewind_agent_shm_job_budget_bytes"]; v != 2<<20 {
		t.Errorf("rewind_agent_shm_job_budget_bytes = %v, want 2 MiB", v)
	}
	out := map[string]float64{}
	for k, v := range s {
		if job, ok := strings.CutPrefix(k, `rewind_agent_shm_job_bytes{job_id="`); ok {
			out[strings.TrimSuffix(job, `"}`)] = v
		}
	}
	return out
}
