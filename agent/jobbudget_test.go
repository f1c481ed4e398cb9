package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestJobBytesMetric: rewind_agent_shm_job_bytes follows each job's
// segments as they are prepared and refused past --job-budget, and
// rewind_agent_shm_job_budget_bytes is the cap.
func TestJobBytesMetric(t *testing.T) {
	d, err := os.MkdirTemp("/dev/shm", "rewind-test-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	cfg := DefaultConfig()
	cfg.Node, cfg.ShmRoot, cfg.Socket = "n", filepath.Join(d, "shm"), filepath.Join(d, "a.sock")
	cfg.ListenAddr, cfg.MetricsAddr, cfg.VerifyAfterCommit = "", "", false
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	cfg.BudgetBytes, cfg.JobBudgetBytes, cfg.Registry = 8<<20, 2<<20, reg
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
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

func jobGauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "rewind_agent_shm_job_bytes":
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		case "rewind_agent_shm_job_budget_bytes":
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 2<<20 {
				t.Errorf("rewind_agent_shm_job_budget_bytes = %v, want 2 MiB", v)
			}
		}
	}
	return out
}
