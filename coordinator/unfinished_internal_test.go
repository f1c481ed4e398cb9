package coordinator

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"rewind.dev/rewind/internal/clock"
)

// newLeadTestCoordinator returns a coordinator on a fake clock, leading
// as leading says (always, when nil).
func newLeadTestCoordinator(t *testing.T, leading func() bool) (*Coordinator, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Logger, cfg.Clock, cfg.Leading = t.TempDir(), discardLogger(), clk, leading
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, clk
}

// inventoryDue returns those of nodes whose inventory finishUnfinished,
// looking now, would wait for.
func inventoryDue(c *Coordinator, nodes ...string) []string {
	since := c.noteLead()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inventoryDueLocked(nodes, since)
}

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
			c, clk := newLeadTestCoordinator(t, leading)
			clk.Step(time.Second)
			if _, err := c.Register(&NodeInfo{Name: "node-0"}, nil, nil); err != nil {
				t.Fatal(err)
			}
			clk.Step(time.Second) // the first look comes after the registration
			if due := inventoryDue(c, "node-0", "node-1"); !slices.Equal(due, []string{"node-1"}) {
				t.Fatalf("inventories due at the first look: %v; want node-1 alone", due)
			}
		})
	}
}

// TestRegistrationOfAnEarlierLeadIsDue: an elected coordinator loses the
// lead and wins it again, no call served in between (the agents went to
// the other leader). A registration from its earlier lead is not this
// lead's: the agent may have told the other leader more since.
func TestRegistrationOfAnEarlierLeadIsDue(t *testing.T) {
	var leads atomic.Bool
	leads.Store(true)
	c, clk := newLeadTestCoordinator(t, leads.Load)
	if _, err := c.Register(&NodeInfo{Name: "node-0"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if due := inventoryDue(c, "node-0"); len(due) != 0 {
		t.Fatalf("inventories due in the lead node-0 registered in: %v", due)
	}
	leads.Store(false)
	clk.Step(time.Second)
	c.noteLead() // finishUnfinished sees the lead lost
	leads.Store(true)
	clk.Step(time.Second)
	if due := inventoryDue(c, "node-0"); !slices.Equal(due, []string{"node-0"}) {
		t.Fatalf("inventories due in the lead won again: %v; want node-0's", due)
	}
}
