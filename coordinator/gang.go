package coordinator

import (
	"maps"
	"slices"
	"sync"
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

// gangs keeps each job's last gang order and the recoveries agents hold
// unfinished (unfinished.go). Its orders go through the order streams
// (orders.go), and no outcome comes back for them. Lock order: gangs.mu,
// then Coordinator.mu, then the order streams' lock.
type gangs struct {
	c *Coordinator

	mu         sync.Mutex
	records    map[string]*gangRecord      // job -> its last gang order
	unfinished map[string]map[string]int64 // job -> node -> step: a gang the node's agent holds broken, no recovery of it known here (unfinished.go)
}

func newGangs(c *Coordinator) *gangs {
	return &gangs{c: c, records: map[string]*gangRecord{}, unfinished: map[string]map[string]int64{}}
}

// gangRecord is a job's last gang order and every node a gang order of the
// job was sent to.
type gangRecord struct {
	kind   coordpb.OrderKind // ORDER_KIND_ABORT or ORDER_KIND_RESUME
	failed bool              // an abort whose recovery failed: not sent again
	step   int64
	epoch  uint64 // the job's epoch when the order was given
	reason string
	nodes  map[string]bool
}

// gangOrders sends kind (abort, resume) to the agents of the job's
// nodes that are up (a resume also to every node an earlier gang order of
// the job went to), and waits (up to 2 s) until their order streams have
// taken them: a rank restarted on a recovery's event must not find its
// agent still saying the gang is broken.
func (c *Coordinator) gangOrders(job string, kind coordpb.OrderKind, step int64, reason string) {
	g := c.gangs
	nodes := map[string]bool{} // where its ranks run, and where copies of its shards live
	if kind == coordpb.OrderKind_ORDER_KIND_RESUME {
		g.mu.Lock() // before c.mu, never inside it
		if rec := g.records[job]; rec != nil {
			maps.Copy(nodes, rec.nodes)
		}
		g.mu.Unlock()
	}
	c.mu.Lock()
	epoch, _ := c.jobEpochLocked(job)
	maps.Copy(nodes, c.jobNodes(job))
	for n := range c.down {
		delete(nodes, n)
	}
	c.mu.Unlock()
	g.mu.Lock()
	rec := g.records[job]
	if rec == nil {
		rec = &gangRecord{nodes: map[string]bool{}}
		g.records[job] = rec
	}
	rec.kind, rec.failed, rec.step, rec.reason, rec.epoch = kind, false, step, reason, epoch
	var ids []uint64
	for _, n := range slices.Sorted(maps.Keys(nodes)) {
		rec.nodes[n] = true
		o := rec.order(job, false)
		if c.streams.send(n, o) {
			ids = append(ids, o.Id)
		}
	}
	g.mu.Unlock()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if !c.streams.pending(ids) {
			return
		}
	}
	c.log.Warn("gang orders not taken by every agent within 2 s", "job", job, "kind", kind.Label())
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

// failed notes that job's recovery failed after its abort: the abort is
// not sent again.
func (g *gangs) failed(job string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rec := g.records[job]; rec != nil && rec.kind == coordpb.OrderKind_ORDER_KIND_ABORT {
		rec.failed = true
	}
}

// reconnected sends node, whose order stream just opened, the gang orders
// it missed, and notes the gangs it holds broken that no recovery here
// knows of (broken: job -> the step its abort named).
func (g *gangs) reconnected(node string, broken map[string]int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.replay(node, broken)
	g.noteBroken(node, broken)
}

func (r *gangRecord) order(job string, replay bool) *coordpb.TransferOrder {
	o := &coordpb.TransferOrder{Job: job, Step: r.step}
	if r.kind == coordpb.OrderKind_ORDER_KIND_ABORT {
		o.Order = &coordpb.TransferOrder_Abort{Abort: &coordpb.AbortOrder{Reason: r.reason, Replay: replay, Epoch: r.epoch}}
	} else {
		o.Order = &coordpb.TransferOrder_Resume{Resume: &coordpb.ResumeOrder{Replay: replay, Epoch: r.epoch}}
	}
	return o
}

// replay queues, for node whose order stream just opened, the last
// gang order of every job that sent one to it or that it holds broken
// (broken: job -> the step its abort named), unless one is waiting unsent
// already. A job whose record is missing is left to noteBroken. The
// caller holds g.mu.
func (g *gangs) replay(node string, broken map[string]int64) {
	for _, job := range slices.Sorted(maps.Keys(g.records)) {
		rec := g.records[job]
		_, holds := broken[job]
		if holds {
			rec.nodes[node] = true // so that the resume to come reaches it
		}
		switch {
		case rec.failed:
			continue
		case rec.kind == coordpb.OrderKind_ORDER_KIND_ABORT && !rec.nodes[node]:
			continue
		case rec.kind == coordpb.OrderKind_ORDER_KIND_RESUME && !rec.nodes[node] && !holds:
			continue
		}
		waiting := g.c.streams.count(func(n string, o *coordpb.TransferOrder, sent bool) bool {
			return n == node && !sent && o.Job == job && o.Kind() == rec.kind && o.Step == rec.step
		}) > 0
		if !waiting {
			g.c.streams.send(node, rec.order(job, true))
			g.c.log.Debug("gang order sent again to a reconnected agent", "node", node, "job", job, "kind", rec.kind.Label(), "step", rec.step)
		}
	}
}
