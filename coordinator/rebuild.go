package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/membership"
)

// The latest consistent step an operator or SDK was told never goes back
// (DESIGN invariant 9). A coordinator restarted on its own store answers
// from it at once: a step is answered consistent only once that decision
// is synced there (group.go), and agents keep every step newer than the
// consistent step they were told until an answer moves them past it, so
// the step is whole in the store and on the agents when the successor
// starts. A coordinator whose index may be behind what was answered
// before it — a standby taking the lease, whose store is its own, or one
// that lost its store — catches up from the agents first:
//
//   - agents register with the latest consistent step each was told, per
//     job (RegisterRequest.pins): the job's floor. A job whose index is
//     below its floor is not answered yet;
//   - a coordinator that begins to lead (Config.Leading) answers no job
//     until the agents of every node it expects (those of its index, and
//     the agents failure detection sees alive) registered with it.
//
// Meanwhile a job's latest step, listings, restore plans of the newest
// step, recoveries and the pins of answers wait: readers get Unavailable
// ("retry"), agents keep the pins they have. The wait for the expected
// nodes ends LeaveGrace after the coordinator began to lead (the time
// agents have to reconnect); a job's wait for its floor ends when absent
// nodes are declared down (absentAfter × LeaveGrace): such a node took
// its shards with it, and the job's newest restorable step is what it is
// (logged).

// ErrRebuilding is an answer withheld while the index catches up with the
// agents; the server maps it to Unavailable: ask again.
var ErrRebuilding = errors.New("rebuilding from the agents")

// rebuild is the catching up; guarded by c.mu.
type rebuild struct {
	leading  bool             // the last served call found this coordinator leading
	started  time.Time        // when it began to lead (or started)
	nodesBy  time.Time        // when the wait for expected nodes ends
	deadline time.Time        // when every wait ends; zero: none
	expect   map[string]bool  // nodes whose agent has not registered since
	blind    bool             // behind, and no node was known to expect: every answer waits until nodesBy
	floor    map[string]int64 // job -> the newest consistent step an agent was told
}

// rebuildGrace is how long the waits last: LeaveGrace, at least a second.
func (c *Coordinator) rebuildGrace() time.Duration { return max(c.cfg.LeaveGrace, time.Second) }

// startRebuild begins the catching up of a coordinator that begins to
// lead (behind: its index may be behind the answers given before it) or
// starts on its own store. The caller holds c.mu.
func (c *Coordinator) startRebuild(behind bool) {
	now := c.cfg.Clock.Now()
	rb := &c.rebuild
	rb.started, rb.nodesBy, rb.deadline = now, now.Add(c.rebuildGrace()), now.Add(absentAfter*c.rebuildGrace())
	rb.floor, rb.expect, rb.blind = map[string]int64{}, map[string]bool{}, false
	if !behind {
		return
	}
	for n := range c.state.Nodes {
		rb.expect[n] = true
	}
	if m, _ := c.members.Load().(*membership.Members); m != nil {
		for _, mem := range m.Members() {
			if mem.Meta.Role == membership.RoleAgent && mem.State == membership.StateAlive {
				rb.expect[mem.Name] = true
			}
		}
	}
	rb.blind = len(rb.expect) == 0
	c.log.Info("began to lead: answers wait for the agents to register", "nodes", len(rb.expect), "at_most", c.rebuildGrace())
}

// noteLeadLocked starts the catching up when this coordinator serves its
// first call since it began to lead. The caller holds c.mu.
func (c *Coordinator) noteLeadLocked() {
	if c.followed.Swap(false) {
		c.rebuild.leading = false
	}
	lead := c.leading()
	if lead && !c.rebuild.leading && c.cfg.Leading != nil {
		c.startRebuild(true)
	}
	c.rebuild.leading = lead
}

// noteRegisteredLocked records that node's agent registered, told the
// latest consistent step of each job in pins, once its inventory is
// applied: a job the index does not know even so (the agent holds none
// of its shards) sets no floor, so an agent cannot hold answers back for
// jobs that do not exist. The caller holds c.mu.
func (c *Coordinator) noteRegisteredLocked(node string, pins map[string]int64) {
	c.noteLeadLocked()
	rb := &c.rebuild
	if rb.deadline.IsZero() {
		return
	}
	delete(rb.expect, node)
	for job, step := range pins {
		if f, ok := rb.floor[job]; c.state.Jobs[job] != nil && step >= 0 && (!ok || step > f) {
			rb.floor[job] = step
		}
	}
}

// rebuildingLocked returns ErrRebuilding, wrapped with the reason, while
// job's answers wait (job "" for answers about every job). The caller
// holds c.mu.
func (c *Coordinator) rebuildingLocked(job string) error {
	c.noteLeadLocked()
	rb := &c.rebuild
	if rb.deadline.IsZero() {
		return nil
	}
	now := c.cfg.Clock.Now()
	if !now.Before(rb.deadline) {
		c.endRebuildLocked()
		return nil
	}
	if len(rb.expect) > 0 || rb.blind {
		if now.Before(rb.nodesBy) {
			return fmt.Errorf("%w: coordinator: began to lead %v ago; the agents of %d known nodes have not registered yet, and others may come (at most %v more)",
				ErrRebuilding, now.Sub(rb.started).Round(time.Millisecond), len(rb.expect), rb.nodesBy.Sub(now).Round(time.Millisecond))
		}
		c.log.Warn("nodes known to the index did not register in time; answering without them", "nodes", len(rb.expect), "waited", rb.nodesBy.Sub(rb.started))
		rb.expect, rb.blind = map[string]bool{}, false
	}
	left := rb.deadline.Sub(now).Round(time.Millisecond)
	check := func(id string) error {
		f, ok := rb.floor[id]
		j := c.state.Jobs[id]
		if !ok {
			return nil
		}
		if j != nil && j.Latest >= f {
			delete(rb.floor, id) // caught up: where latest goes from here is the index's own
			return nil
		}
		latest := int64(-1)
		if j != nil {
			latest = j.Latest
		}
		return fmt.Errorf("%w: coordinator: job %s: agents were told step %d is consistent, the index has rebuilt %d so far (at most %v more)",
			ErrRebuilding, id, f, latest, left)
	}
	if job != "" {
		return check(job)
	}
	for id := range rb.floor {
		if err := check(id); err != nil {
			return err
		}
	}
	return nil
}

// catchingUpLocked reports whether this coordinator is still catching up
// with the agents: its index may be behind what they were told. The
// caller holds c.mu.
func (c *Coordinator) catchingUpLocked() bool {
	rb := &c.rebuild
	return !rb.deadline.IsZero() && c.cfg.Clock.Now().Before(rb.deadline)
}

// endRebuildLocked ends the waits at the deadline, logging each job whose
// index never reached its floor: the shards of that step on some node
// are gone (the node did not come back). The caller holds c.mu.
func (c *Coordinator) endRebuildLocked() {
	rb := &c.rebuild
	for id, f := range rb.floor {
		if j := c.state.Jobs[id]; j == nil || j.Latest < f {
			latest := int64(-1)
			if j != nil {
				latest = j.Latest
			}
			c.log.Warn("a job's latest consistent step goes back: agents were told a newer one, whose shards did not all come back",
				"job", id, "told", f, "latest", latest, "waited", rb.deadline.Sub(rb.started))
		}
	}
	rb.deadline, rb.expect, rb.floor, rb.blind = time.Time{}, nil, nil, false
}

// waitRebuilt waits until job's answers no longer wait, or ctx ends: a
// recovery plans from an index that has caught up.
func (c *Coordinator) waitRebuilt(ctx context.Context, job string) error {
	for {
		c.mu.Lock()
		err := c.rebuildingLocked(job)
		c.mu.Unlock()
		if err == nil {
			return nil
		}
		if clock.Sleep(ctx, 50*time.Millisecond) != nil {
			return fmt.Errorf("coordinator: %w", errors.Join(ctx.Err(), err))
		}
	}
}
