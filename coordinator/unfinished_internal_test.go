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

// TestABrokenGangWaitsForItsNodesInventory: after a restart that lost the
// index, an agent's order stream (which names the gangs it holds broken)
// may connect more than the grace before its registration (which names
// the job's copies on it): the claim must wait for the inventory, then be
// acted on, not be forgotten because the job was unknown at the grace. A
// node that registered in this lead and takes no part in the job has its
// claim forgotten at the grace; a node that never registers, when the
// absent nodes are given up on.
func TestABrokenGangWaitsForItsNodesInventory(t *testing.T) {
	c, clk := newLeadTestCoordinator(t, nil)
	since := c.noteLead()
	clk.Step(time.Second)
	if _, err := c.Register(&NodeInfo{Name: "node-c"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	g := c.gangs
	g.mu.Lock()
	g.noteBroken("node-b", map[string]int64{"victim": 3})
	g.noteBroken("node-c", map[string]int64{"victim": 3, "other": 5})
	g.noteBroken("node-x", map[string]int64{"other": 5})
	g.mu.Unlock()
	if todo := g.unfinishedJobs(true, false, since); len(todo) != 0 {
		t.Fatalf("unfinished before node-b's inventory: %v; want none yet", todo)
	}
	if got := g.unfinished["victim"]; len(got) != 1 || got["node-b"] != 3 {
		t.Fatalf("claims on victim past the grace: %v; want node-b's alone (its inventory is due, node-c's is in)", got)
	}
	rec := Record{Job: "victim", Step: 3, Rank: 0, WorldSize: 1, Node: "node-b", Size: 4096, Sum: "s", State: CopyCommitted}
	if _, err := c.Register(&NodeInfo{Name: "node-b"}, []Record{rec}, nil); err != nil {
		t.Fatal(err)
	}
	if todo := g.unfinishedJobs(true, false, since); todo["victim"] != 3 {
		t.Fatalf("unfinished once node-b registered its copy of victim: %v; want victim at step 3", todo)
	}
	if _, ok := g.unfinished["other"]["node-x"]; !ok {
		t.Fatal("node-x's claim forgotten before node-x registered or was given up on")
	}
	g.unfinishedJobs(true, true, since)
	if _, ok := g.unfinished["other"]; ok {
		t.Fatalf("claims on other after giving up on absent nodes: %v", g.unfinished["other"])
	}
}
