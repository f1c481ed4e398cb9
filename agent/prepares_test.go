package agent

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/promtest"
)

// TestUncommittedPrepareExpires: a Prepare never committed holds its
// budget while it is younger than PrepareTTL, so another job's save is
// refused for lack of budget; once it is older, that save takes the
// segment back and goes ahead, the segment file is gone, and the late
// Commit is refused, naming the expiry.
func TestUncommittedPrepareExpires(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	reg := prometheus.NewRegistry()
	a := localAgent(t, func(cfg *Config) {
		cfg.Clock, cfg.BudgetBytes, cfg.PrepareTTL, cfg.Registry = clk, 1<<20, time.Minute, reg
	})
	ctx := context.Background()
	const size = 768 << 10 // two do not fit in the 1 MiB budget
	stale, err := a.Prepare(ctx, "a", 0, 1, 1, size)
	if err != nil {
		t.Fatal(err)
	}

	clk.Step(time.Minute - time.Second)
	if _, err := a.Prepare(ctx, "b", 0, 1, 1, size); !errors.Is(err, ErrBudget) {
		t.Fatalf("a save while the other prepare is %v old: %v, want ErrBudget", time.Minute-time.Second, err)
	}
	clk.Step(time.Second)
	if _, err := a.Prepare(ctx, "b", 0, 1, 1, size); err != nil {
		t.Fatalf("a save once the other prepare is a TTL old: %v", err)
	}
	if _, err := os.Stat(stale.Path); !os.IsNotExist(err) {
		t.Errorf("the expired prepare's segment is still there: %v", err)
	}
	if _, err := a.Commit(ctx, "a", 0, stale.Slot, stale.Token, 1, "sum"); err == nil || !strings.Contains(err.Error(), "prepare expired") {
		t.Errorf("the expired prepare's commit: %v, want a refusal naming the expiry", err)
	}
	if n := expiredCount(t, reg); n != 1 {
		t.Errorf("rewind_agent_prepares_expired_total = %v, want 1", n)
	}
	if used := a.budget - uint64(a.budgetLeft("b")); used != size {
		t.Errorf("budget in use %d, want the one live prepare's %d", used, size)
	}
}

func expiredCount(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	v, ok := promtest.Samples(t, reg)["rewind_agent_prepares_expired_total"]
	if !ok {
		t.Fatal("no rewind_agent_prepares_expired_total")
	}
	return v
}
