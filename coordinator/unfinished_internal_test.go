package coordinator

import (
	"slices"
	"testing"
	"time"

	"rewind.dev/rewind/internal/clock"
)

// TestRegisteredBeforeTheFirstLookIsThisLeads: the agents of a restarted
// (or newly elected) coordinator reconnect and register at once, often
// before finishUnfinished first looks at the lead (it polls, and on a
// loaded machine it looks late). Their inventories are this lead's all the
// same: counted as not yet registered, an agent that is back held an
// unfinished recovery unfinished for good. A node that never registered
// stays due.
func TestRegisteredBeforeTheFirstLookIsThisLeads(t *testing.T) {
	for name, leading := range map[string]func() bool{
		"alone":   nil,
		"elected": func() bool { return true },
	} {
		t.Run(name, func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1_800_000_000, 0))
			cfg := DefaultConfig()
			cfg.DataDir, cfg.Logger, cfg.Clock, cfg.Leading = t.TempDir(), discardLogger(), clk, leading
			c, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			clk.Step(time.Second)
			if _, err := c.Register(&NodeInfo{Name: "node-0"}, nil, nil); err != nil {
				t.Fatal(err)
			}
			clk.Step(time.Second) // the first look comes after the registration
			since := c.leadBegan()
			c.mu.Lock()
			due := c.inventoryDueLocked([]string{"node-0", "node-1"}, since)
			c.mu.Unlock()
			if !slices.Equal(due, []string{"node-1"}) {
				t.Fatalf("inventories due at the first look (the lead begun at %v): %v; want node-1 alone", since, due)
			}
		})
	}
}
