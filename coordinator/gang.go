package coordinator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/membership"
)

// Gang orders: "abort" tells the agents of a job's nodes that its gang is
// broken (their ranks' calls fail until the recovery is done), "resume"
// that it is whole again. They travel on the agents' order streams, which
// a broken connection may cut after the coordinator took an order and
// before the agent read it; an agent that missed a resume would fail its
// ranks' calls for good. So the coordinator keeps each job's last gang
// order, and sends it again to every agent it concerns whose order stream
// (re)connects: level-triggered, like a reconcile, not edge-triggered. An
// agent applies a gang order again without harm (agent/gang.go).

// gangRecord is a job's last gang order and every node a gang order of the
// job was sent to.
type gangRecord struct {
	kind   string
	step   int64
	reason string
	nodes  map[string]bool
}

// gangOrders sends kind ("abort", "resume") to the agents of the job's
// nodes that are up, and waits (up to 2 s) until their order streams have
// taken them: a rank restarted on a recovery's event must not find its
// agent still saying the gang is broken.
func (c *Coordinator) gangOrders(job, kind string, step int64, reason string) {
	c.mu.Lock()
	nodes := map[string]bool{} // where its ranks run, and where copies of its shards live
	if j := c.state.Jobs[job]; j != nil {
		for _, n := range j.Placement {
			nodes[n] = true
		}
		for n := range c.state.Nodes {
			if c.state.JobsOn(n)[job] {
				nodes[n] = true
			}
		}
	}
	for n := range c.down {
		delete(nodes, n)
	}
	c.mu.Unlock()
	t := c.tiers
	t.mu.Lock()
	rec := t.gangs[job]
	if rec == nil {
		rec = &gangRecord{nodes: map[string]bool{}}
		t.gangs[job] = rec
	}
	rec.kind, rec.step, rec.reason = kind, step, reason
	var ids []uint64
	for _, n := range slices.Sorted(maps.Keys(nodes)) {
		rec.nodes[n] = true
		o := rec.order(job)
		t.send(n, o)
		if t.subs[n] != nil {
			ids = append(ids, o.Id)
		}
	}
	t.mu.Unlock()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		t.mu.Lock()
		pending := slices.ContainsFunc(ids, func(id uint64) bool { return t.orders[id] != nil })
		t.mu.Unlock()
		if !pending {
			return
		}
	}
	c.log.Warn("gang orders not taken by every agent within 2 s", "job", job, "kind", kind)
}

func (r *gangRecord) order(job string) *coordpb.TransferOrder {
	return &coordpb.TransferOrder{Kind: r.kind, Job: job, Step: r.step, Reason: r.reason}
}

// replayGangs queues, for node whose order stream just opened, the last
// gang order of every job that sent one to it, unless one is waiting
// unsent already. The caller holds t.mu.
func (t *tierer) replayGangs(node string) {
	for _, job := range slices.Sorted(maps.Keys(t.gangs)) {
		rec := t.gangs[job]
		if !rec.nodes[node] {
			continue
		}
		waiting := false
		for _, od := range t.orders {
			if od.node == node && !od.sent && od.o.Job == job && od.o.Kind == rec.kind && od.o.Step == rec.step {
				waiting = true
				break
			}
		}
		if !waiting {
			t.send(node, rec.order(job))
			t.c.log.Debug("gang order sent again to a reconnected agent", "node", node, "job", job, "kind", rec.kind, "step", rec.step)
		}
	}
}

// sendGangOrder sends a gang order on an agent's order stream. The fault
// point stands for the connection breaking after the order was taken.
func (t *tierer) sendGangOrder(ctx context.Context, stream coordpb.Coordinator_TransfersServer, o *coordpb.TransferOrder) error {
	if o.Kind == "resume" {
		if err := t.c.cfg.Faults.Check(ctx, faultinject.CoordResumeSent); err != nil {
			return err
		}
	}
	return stream.Send(o)
}

// Recoveries left unfinished. A coordinator that exits between a job's
// abort and its resume (a crash, a restart, a standby taking the lease)
// takes its gang record with it, and the aborted agents would fail their
// ranks' calls for good. But they know: every agent names the gangs it
// holds broken when its order stream connects (TransfersRequest
// broken_gangs). A job so named that has no recovery known here is
// finished as soon as the agents of every node it is placed on are back:
// it is restarted at the step its abort named (RestartJob, with force: the
// interrupted recovery was already going back to it). Once the agents had
// time to reconnect (LeaveGrace from when this coordinator began to lead,
// at least a second), a node the job is placed on whose agent did not
// come back is declared down, and the recovery that follows re-gangs the
// job.

// noteBroken records the gangs node holds broken that no recovery here
// knows of. The caller holds t.mu.
func (t *tierer) noteBroken(node string, broken map[string]int64) {
	for job, step := range broken {
		if t.gangs[job] != nil {
			continue // its last gang order was sent again (replayGangs)
		}
		if _, ok := t.unfinished[job]; !ok {
			t.c.log.Warn("an agent holds a job's gang broken with no recovery of it known here: the previous coordinator left it unfinished",
				"node", node, "job", job, "step", step)
			t.unfinished[job] = step
		}
	}
}

// finishUnfinished finishes the recoveries agents report unfinished, and
// declares down the placed nodes that never came back (absentNodes),
// while this coordinator leads, until ctx ends. The graces count from
// when it began to lead (a standby's agents connect to it only then).
func (c *Coordinator) finishUnfinished(ctx context.Context) {
	grace := max(c.cfg.LeaveGrace, time.Second)
	var start time.Time // when this coordinator began to lead; zero while it does not
	warned := map[string]bool{}
	for clock.Sleep(ctx, 250*time.Millisecond) == nil {
		if !c.leading() {
			start = time.Time{}
			continue
		}
		t := c.tiers
		if start.IsZero() {
			start = time.Now()
			t.mu.Lock()
			clear(t.seen) // from an earlier lead: the agents' streams went elsewhere since
			for n := range t.subs {
				t.seen[n] = true
			}
			t.mu.Unlock()
		}
		if time.Since(start) >= absentAfter*grace {
			c.absentNodes(start, warned)
		}
		todo := t.unfinishedJobs()
		for _, job := range slices.Sorted(maps.Keys(todo)) {
			c.finishRecovery(ctx, job, todo[job], time.Since(start) >= grace)
		}
	}
}

// unfinishedJobs returns the unfinished recoveries still to finish, and
// forgets those a recovery or restart has begun on since.
func (t *tierer) unfinishedJobs() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	todo := map[string]int64{}
	for job, step := range t.unfinished {
		if t.gangs[job] == nil {
			todo[job] = step
		} else {
			delete(t.unfinished, job)
		}
	}
	return todo
}

// finishRecovery finishes job's unfinished recovery back to step: at once
// when the agents of every node the job is placed on are back, else once
// the grace is over. It is tried again until a gang order of the job is
// sent (the recovery or the restart began): a node declared down may wait
// for quorum, and, within the grace, a restart may wait for the agents'
// inventories (a standby's index is rebuilt from them).
func (c *Coordinator) finishRecovery(ctx context.Context, job string, step int64, graceOver bool) {
	c.mu.Lock()
	var placed []string
	if j := c.state.Jobs[job]; j != nil {
		placed = slices.Sorted(maps.Values(j.Placement))
	}
	c.mu.Unlock()
	placed = slices.Compact(placed)
	t := c.tiers
	t.mu.Lock()
	absent := slices.DeleteFunc(placed, func(n string) bool { return t.subs[n] != nil })
	t.mu.Unlock()
	if len(absent) > 0 && !graceOver {
		return
	}
	if len(absent) > 0 {
		for _, n := range absent {
			if _, err := c.NodeDown(n, "its agent did not reconnect after the coordinator restarted during a recovery of job "+job); err != nil {
				c.log.Warn("a node of an unfinished recovery is absent, but cannot be declared down", "job", job, "node", n, "err", err)
			}
		}
		return
	}
	c.log.Warn("finishing a recovery the previous coordinator left unfinished", "job", job, "step", step)
	_, err := c.RestartJob(ctx, job, step, "coordinator (a recovery its predecessor left unfinished)", true, false)
	if err == nil || !graceOver {
		return
	}
	// Not tried again: the job's gang stays broken until an operator
	// restores it (rewind restore), as after any failed recovery.
	t.mu.Lock()
	delete(t.unfinished, job)
	began := t.gangs[job] != nil // the re-gang began, and published its failure
	t.mu.Unlock()
	if began {
		return
	}
	c.failRegang(&coordpb.JobEvent{Job: job, Step: step, Reason: "finishing a recovery the previous coordinator left unfinished",
		DetectedUnixNano: c.cfg.Clock.Now().UnixNano()}, err)
}

// Nodes placed on but never seen. A node that dies while no coordinator
// runs (or during a failover) is reported by no one: failure detection
// declares dead only the members it knew alive. So, with failure
// detection on, a node that a job's ranks are placed on, whose agent has
// not opened its order stream since this coordinator began to lead
// (absentAfter × LeaveGrace ago at least: 30 s by default, well past an
// agent's reconnect backoff of at most 5 s), and that failure detection
// does not know alive, is declared down, and its jobs recovered. Without
// failure detection nodes are declared down by operators (rewind
// node-down), and this does nothing.

const absentAfter = 3

// absentNodes declares down the placed nodes never seen since start;
// warned keeps a node that cannot be (no quorum) from a warning a second.
func (c *Coordinator) absentNodes(start time.Time, warned map[string]bool) {
	m, _ := c.members.Load().(*membership.Members)
	if m == nil {
		return
	}
	c.mu.Lock()
	placed := map[string]bool{}
	for _, j := range c.state.Jobs {
		for _, n := range j.Placement {
			if _, down := c.down[n]; !down {
				placed[n] = true
			}
		}
	}
	c.mu.Unlock()
	t := c.tiers
	t.mu.Lock()
	maps.DeleteFunc(placed, func(n string, _ bool) bool { return t.seen[n] })
	t.mu.Unlock()
	for _, n := range slices.Sorted(maps.Keys(placed)) {
		if mb, ok := m.Member(n); ok && (mb.State == membership.StateAlive || mb.State == membership.StateSuspect) {
			continue
		}
		reason := fmt.Sprintf("placed on, but its agent has not connected since the coordinator began to lead %s ago", time.Since(start).Round(time.Second))
		if _, err := c.NodeDown(n, reason); err != nil && !warned[n] {
			warned[n] = true
			c.log.Warn("a placed node never came back, but cannot be declared down", "node", n, "err", err)
		}
	}
}
