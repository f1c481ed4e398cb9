package coordinator

import (
	"maps"
	"slices"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// Gang orders: "abort" tells the agents of a job's nodes that its gang is
// broken (their ranks' calls fail until the recovery is done), "resume"
// that it is whole again. They travel on the agents' order streams, which
// a broken connection may cut after the coordinator took an order and
// before the agent read it; an agent that missed a resume would fail its
// ranks' calls for good. So the coordinator keeps each job's last gang
// order and every node a gang order of the job went to, and sends it
// again (replay set) to such a node whose order stream (re)connects, and
// to any agent that reports the job's gang broken: level-triggered, like a
// reconcile. An abort is sent again only while its recovery runs: one
// that failed is not (the ranks an operator restores since must not be
// broken again, nor their newer steps discarded). A replayed resume ends
// the agent's break and discards nothing (agent/transfer.go).

// gangRecord is a job's last gang order and every node a gang order of the
// job was sent to.
type gangRecord struct {
	kind   string // "abort" (its recovery runs), "resume", or "failed" (the recovery failed after its abort)
	step   int64
	reason string
	nodes  map[string]bool
}

// gangOrders sends kind ("abort", "resume") to the agents of the job's
// nodes that are up (a resume also to every node an earlier gang order of
// the job went to), and waits (up to 2 s) until their order streams have
// taken them: a rank restarted on a recovery's event must not find its
// agent still saying the gang is broken.
func (c *Coordinator) gangOrders(job, kind string, step int64, reason string) {
	t := c.tiers
	nodes := map[string]bool{} // where its ranks run, and where copies of its shards live
	if kind == "resume" {
		t.mu.Lock() // before c.mu, never inside it: other paths take t.mu, then c.mu
		if rec := t.gangs[job]; rec != nil {
			maps.Copy(nodes, rec.nodes)
		}
		t.mu.Unlock()
	}
	c.mu.Lock()
	maps.Copy(nodes, c.jobNodes(job))
	for n := range c.down {
		delete(nodes, n)
	}
	c.mu.Unlock()
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
		o := rec.order(job, false)
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

// jobNodes returns the nodes job's ranks run on and the nodes holding
// copies of its shards. The caller holds c.mu.
func (c *Coordinator) jobNodes(job string) map[string]bool {
	nodes := map[string]bool{}
	if j := c.state.Jobs[job]; j != nil {
		for _, n := range j.Placement {
			nodes[n] = true
		}
	}
	for n := range c.state.Nodes {
		if c.state.JobsOn(n)[job] {
			nodes[n] = true
		}
	}
	return nodes
}

// gangFailed notes that job's recovery failed after its abort: the abort
// is not sent again.
func (t *tierer) gangFailed(job string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rec := t.gangs[job]; rec != nil && rec.kind == "abort" {
		rec.kind = "failed"
	}
}

func (r *gangRecord) order(job string, replay bool) *coordpb.TransferOrder {
	return &coordpb.TransferOrder{Kind: r.kind, Job: job, Step: r.step, Reason: r.reason, Replay: replay}
}

// replayGangs queues, for node whose order stream just opened, the last
// gang order of every job that sent one to it or that it holds broken
// (broken: job -> the step its abort named), unless one is waiting unsent
// already. A job whose record is missing is left to noteBroken. The
// caller holds t.mu.
func (t *tierer) replayGangs(node string, broken map[string]int64) {
	for _, job := range slices.Sorted(maps.Keys(t.gangs)) {
		rec := t.gangs[job]
		_, holds := broken[job]
		if holds {
			rec.nodes[node] = true // so that the resume to come reaches it
		}
		switch {
		case rec.kind == "failed":
			continue
		case rec.kind == "abort" && !rec.nodes[node]:
			continue
		case rec.kind == "resume" && !rec.nodes[node] && !holds:
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
			t.send(node, rec.order(job, true))
			t.c.log.Debug("gang order sent again to a reconnected agent", "node", node, "job", job, "kind", rec.kind, "step", rec.step)
		}
	}
}
