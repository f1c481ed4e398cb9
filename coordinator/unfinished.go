package coordinator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/membership"
)

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
// job. Only the agents of nodes that take part in the job (a rank placed
// there, or a copy of its shards) are believed: otherwise any node could
// restart any job, or have its nodes declared down, by naming it.

// noteBroken records the gangs node holds broken that no recovery here
// knows of. The caller holds g.mu.
func (g *gangs) noteBroken(node string, broken map[string]int64) {
	for job, step := range broken {
		if g.records[job] != nil {
			continue // its last gang order was sent again (replay)
		}
		if _, ok := g.unfinished[job][node]; !ok {
			g.c.log.Warn("an agent holds a job's gang broken with no recovery of it known here: the previous coordinator left it unfinished",
				"node", node, "job", job, "step", step)
		}
		if g.unfinished[job] == nil {
			g.unfinished[job] = map[string]int64{}
		}
		g.unfinished[job][node] = step
	}
}

// finishUnfinished finishes the recoveries agents report unfinished, and
// declares down the placed nodes that never came back (absentNodes),
// while this coordinator leads, until ctx ends. The graces count from
// when it began to lead (a standby's agents connect to it only then).
func (c *Coordinator) finishUnfinished(ctx context.Context) {
	grace := max(c.cfg.LeaveGrace, time.Second)
	var start time.Time // when this coordinator began to lead; zero while it does not
	var since time.Time // the same, on the coordinator's clock (agents' RegisteredAt)
	warned := map[string]bool{}
	for clock.Sleep(ctx, 250*time.Millisecond) == nil {
		if !c.leading() {
			c.noteLead() // the lead lost: the next one begins anew
			start = time.Time{}
			continue
		}
		if start.IsZero() {
			start, since = time.Now(), c.noteLead()
			c.streams.resetSeen() // from an earlier lead: the agents' streams went elsewhere since
		}
		if time.Since(start) >= absentAfter*grace {
			c.absentNodes(start, warned)
		}
		todo := c.gangs.unfinishedJobs(time.Since(start) >= grace, time.Since(start) >= absentAfter*grace, since)
		for _, job := range slices.Sorted(maps.Keys(todo)) {
			c.finishRecovery(ctx, job, todo[job], since, time.Since(start) >= grace, warned)
		}
	}
}

// unfinishedJobs returns the unfinished recoveries still to finish, each
// at the step its abort named by the agents of the nodes that take part in
// the job, and forgets those a recovery or restart has begun on since.
// A node's claim on a job it takes no part in (or of a job the index does
// not know) waits while its inventory may still make it take part: until
// the grace is over and the node registered in this lead (since), or
// until giveUp (the node never registered); then it is forgotten. The
// order stream that carries the claim connects apart from the
// registration, and may come first by more than the grace.
func (g *gangs) unfinishedJobs(graceOver, giveUp bool, since time.Time) map[string]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	todo := map[string]int64{}
	for job, by := range g.unfinished {
		if g.records[job] != nil {
			delete(g.unfinished, job)
			continue
		}
		j := g.c.state.Jobs[job]
		for _, n := range slices.Sorted(maps.Keys(by)) {
			if j != nil && g.c.takesPartLocked(n, j) {
				todo[job] = by[n]
				break
			}
		}
		if _, ok := todo[job]; ok || !graceOver {
			continue
		}
		for _, n := range slices.Sorted(maps.Keys(by)) {
			if giveUp || len(g.c.inventoryDueLocked([]string{n}, since)) == 0 {
				g.c.log.Warn("the agent of a node that takes no part in a job holds its gang broken; ignored", "job", job, "node", n)
				delete(by, n)
			}
		}
		if len(by) == 0 {
			delete(g.unfinished, job)
		}
	}
	return todo
}

// forgetUnfinished gives up job's unfinished recovery, and reports
// whether a gang order of the job was sent since (its re-gang began).
func (g *gangs) forgetUnfinished(job string) (began bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.unfinished, job)
	return g.records[job] != nil
}

// finishRecovery finishes job's unfinished recovery back to step: at once
// when the agents of every node the job is placed on are back, else once
// the grace is over. It is tried again until a gang order of the job is
// sent (the recovery or the restart began): a node declared down may wait
// for quorum, and, within the grace, a restart may wait for the agents'
// inventories (a standby's index is rebuilt from them). Nothing is
// declared down or restarted while an agent that is back has not
// registered its inventory since the lead began (since): a recovery
// planned without it would find no step with a copy of every rank.
func (c *Coordinator) finishRecovery(ctx context.Context, job string, step int64, since time.Time, graceOver bool, warned map[string]bool) {
	c.mu.Lock()
	var placed []string
	later := false // a consistent step after the abort's: the job trained on since
	if j := c.state.Jobs[job]; j != nil {
		placed = slices.Sorted(maps.Values(j.Placement))
		later = j.Latest > step
	}
	placed = slices.Compact(placed)
	inventoryDue := c.inventoryDueLocked(placed, since)
	c.mu.Unlock()
	if later {
		// A stale report: an agent that missed the resume of a recovery
		// that did finish (its node was down then). It is told the job
		// runs; nothing is restarted, nothing discarded.
		c.log.Warn("an agent holds a job's gang broken from a recovery that finished; it is told to resume", "job", job, "step", step)
		c.replayResume(job)
		return
	}
	absent := c.streams.unseen(placed)
	if len(absent) > 0 && !graceOver {
		return
	}
	if len(slices.DeleteFunc(inventoryDue, func(n string) bool { return slices.Contains(absent, n) })) > 0 {
		return // an agent is back but its inventory is not in yet
	}
	if len(absent) > 0 {
		for _, n := range absent {
			_, err := c.NodeDown(n, "its agent did not reconnect after the coordinator restarted during a recovery of job "+job)
			if err != nil && !warned[n] {
				warned[n] = true
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
	// From here on it is tried again as a recovery that failed after its
	// plan (retry.go): planned afresh from the nodes alive then.
	const reason = "finishing a recovery the previous coordinator left unfinished"
	now := c.cfg.Clock.Now()
	if !c.gangs.forgetUnfinished(job) { // else the re-gang began, and published its failure
		c.failRegang(&coordpb.JobEvent{Job: job, Step: step, Reason: reason, DetectedUnixNano: now.UnixNano()}, err)
	}
	c.retryFailed(job, "", reason, now, err)
}

// noteLead notes whether this coordinator leads (noteLeadLocked), and
// returns when its lead began, on its clock: when it started, or, elected
// (Config.Leading), when it first saw itself leading, by a call it served
// or by this look. Every registration of the lead is stamped after it
// (Register notes the lead first), however late the look: the agents of
// a restarted coordinator register at once, often before
// finishUnfinished first looks.
func (c *Coordinator) noteLead() (began time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.noteLeadLocked()
	return c.rebuild.started
}

// inventoryDueLocked returns those of nodes whose agent has not
// registered its inventory since the lead began (since). The caller holds
// c.mu.
func (c *Coordinator) inventoryDueLocked(nodes []string, since time.Time) []string {
	var due []string
	for _, n := range nodes {
		if info := c.state.Nodes[n]; info == nil || info.RegisteredAt.Before(since) {
			due = append(due, n)
		}
	}
	return due
}

// replayResume records a resume of job at its latest step and sends it,
// replayed, to the agents of the job's nodes: those that hold its gang
// broken end the break, the others change nothing.
func (c *Coordinator) replayResume(job string) {
	c.mu.Lock()
	rec := &gangRecord{kind: coordpb.OrderKind_ORDER_KIND_RESUME, step: -1, nodes: c.jobNodes(job)}
	if j := c.state.Jobs[job]; j != nil {
		rec.step = j.Latest
	}
	c.mu.Unlock()
	g := c.gangs
	g.mu.Lock()
	defer g.mu.Unlock()
	g.records[job] = rec
	delete(g.unfinished, job)
	for _, n := range slices.Sorted(maps.Keys(rec.nodes)) {
		c.streams.send(n, rec.order(job, true))
	}
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
	for _, n := range c.streams.unseen(slices.Sorted(maps.Keys(placed))) {
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
