package coordinator

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// Peer replication: once a step is consistent, every rank's shard is
// copied into the shared memory of Replicas other nodes, chosen in other
// failure domains first. The peer pulls the shard from the holder's agent,
// checks every checksum, and commits it like a save; its agent's report
// puts the replica in the index. The peer of a node is stable from step to
// step (the next nodes after it in name order, other domains first), so a
// replica lands in segments the peer has already faulted in, and it never
// displaces the latest consistent step there: a replica is a save like
// any other for the peer's slots, pins and budget.
//
// As with tiers, one step of a job is replicated at a time; a step that
// becomes consistent meanwhile waits, and only the latest is replicated.
// A step counts as replicated only when every rank got its replicas: a
// rank left for later (its commit's replicas in flight, a peer whose
// order stream is not connected yet) keeps the step for the next scan,
// and a replica that failed is ordered again, maxReplicaTries times at
// most, backing off from replicaRetryAfter.

// replication orders the replicas of shards in peers' shared memory: of
// each job's latest consistent step, and of each primary commit. Its
// orders go through the order streams (orders.go), whose outcomes it
// claims. Lock order: replication.mu, then Coordinator.mu, then the order
// streams' lock.
type replication struct {
	c *Coordinator
	m *tierMetrics

	commits chan commitRec // primary commits to replicate, queued without a lock

	mu           sync.Mutex
	closed       bool                        // the store is closing: nothing changes
	jobReplicas  map[string]int              // per job; absent: the default
	replicated   map[string]int64            // job -> newest step replicated
	steps        map[string]*stepReplication // job -> replication of a step in flight
	rankRepl     map[rankKey]int             // replica orders of commits in flight per rank
	rankNext     map[rankKey]commitRec       // per rank, the newest commit waiting for them
	commitOrders map[uint64]rankKey          // replica order of a commit -> its rank
	retries      map[string]replicaRetry     // job -> the failed tries of its step in flight
	// made is, per rank, the newest step a replica of which a peer
	// reported made, its header checksum, and the peers: the peer's own
	// report of the copy comes on another stream, and until it is in the
	// index neither path may order the same replica again.
	made map[rankKey]madeReplicas
	// ordered counts the replicate orders in flight per rank, step,
	// checksum and peer. The commit of a step that the scan has just made
	// consistent is dequeued after the scan ordered its replicas: the
	// commit path skips those (the scan never meets the commit path's
	// orders in flight: it leaves a rank that has any for its next look).
	// A second order of a replica has the peer verify its copy once more
	// for nothing, and a peer whose copy had rotted dropped it before any
	// restore looked.
	ordered map[replicaKey]int
}

// replicaKey names a replica: a rank's shard of a step (by its header
// checksum) on a peer.
type replicaKey struct {
	rankKey
	step      int64
	sum, peer string
}

type madeReplicas struct {
	step  int64
	sum   string
	peers []string
}

// replicaRetry counts the tries of a job's step whose replicas failed.
type replicaRetry struct {
	step  int64
	tries int
	after time.Time // not tried again before
}

const (
	maxReplicaTries   = 4
	replicaRetryAfter = 500 * time.Millisecond
)

// stepReplication is a job's replication of a step in flight.
type stepReplication struct {
	step    int64
	pending map[uint64]bool // order ids not yet reported
	failed  int
	short   bool // a rank was left for a later scan
	started time.Time
}

func newReplication(c *Coordinator, m *tierMetrics) *replication {
	return &replication{c: c, m: m, commits: make(chan commitRec, 1<<16), jobReplicas: map[string]int{},
		replicated: map[string]int64{}, steps: map[string]*stepReplication{}, rankRepl: map[rankKey]int{},
		rankNext: map[rankKey]commitRec{}, commitOrders: map[uint64]rankKey{}, retries: map[string]replicaRetry{},
		made: map[rankKey]madeReplicas{}, ordered: map[replicaKey]int{}}
}

// load restores the jobs' replica counts read from the store.
func (rp *replication) load(replicas map[string]int) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	maps.Copy(rp.jobReplicas, replicas)
}

// MaxReplicas is the most peers that may keep a copy of each shard: each
// costs a shard of memory on another node per rank.
const MaxReplicas = 8

// validateReplicas checks a job's replica count; it changes nothing.
func validateReplicas(job string, n int) error {
	if n < 0 || n > MaxReplicas {
		return fmt.Errorf("%w: coordinator: job %s: replicas %d out of range [0, %d]", ErrInvalid, job, n, MaxReplicas)
	}
	return nil
}

// setReplicas sets how many peers keep a copy of each of job's shards.
func (rp *replication) setReplicas(job string, n int) error {
	if err := validateReplicas(job, n); err != nil {
		return err
	}
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if old, ok := rp.jobReplicas[job]; ok && old == n {
		return nil
	}
	if err := rp.c.store.putReplicas(job, n); err != nil {
		return err
	}
	rp.jobReplicas[job] = n
	rp.c.log.Info("job replicas set", "job", job, "replicas", n)
	return nil
}

// close stops every change: the coordinator is shutting down.
func (rp *replication) close() {
	rp.mu.Lock()
	rp.closed = true
	rp.mu.Unlock()
}

// replicas returns how many peer copies a job keeps.
func (rp *replication) replicas(job string) int {
	if n, ok := rp.jobReplicas[job]; ok {
		return n
	}
	return rp.c.cfg.Replicas
}

// scan starts the replication of each job's latest consistent step not
// replicated yet. It runs on the tiers' scan (transfers.go).
func (rp *replication) scan() {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.closed {
		return
	}
	rp.c.mu.Lock()
	defer rp.c.mu.Unlock()
	for _, j := range rp.c.state.Jobs {
		rp.replicate(j)
	}
}

// replicate starts the replication of job's latest consistent step when
// it is not replicated yet; the caller holds rp.mu and rp.c.mu.
func (rp *replication) replicate(j *Job) {
	want := rp.replicas(j.ID)
	if done, ok := rp.replicated[j.ID]; want <= 0 || j.Latest < 0 || ok && done >= j.Latest || rp.steps[j.ID] != nil {
		return
	}
	st := j.Steps[j.Latest]
	if st == nil || st.State != Consistent {
		return
	}
	now := rp.c.cfg.Clock.Now()
	if rt, ok := rp.retries[j.ID]; ok && rt.step == st.Step && now.Before(rt.after) {
		return
	}
	r := &stepReplication{step: st.Step, pending: map[uint64]bool{}, started: now}
	live := -1 // registered nodes not declared down, counted once when needed
	for rank := range st.WorldSize {
		var src *Copy
		have := map[string]bool{}
		for _, cp := range st.Copies[rank] {
			if cp.Tier == "shm" && cp.State == CopyCommitted {
				have[cp.Node] = true
				if src == nil || cp.Node == j.Placement[rank] {
					src = cp
				}
			}
		}
		if src == nil {
			continue
		}
		for _, p := range rp.madeBy(rankKey{j.ID, rank}, st.Step, src.Sum) {
			have[p] = true
		}
		if rp.rankRepl[rankKey{j.ID, rank}] != 0 {
			r.short = true // its commit is being replicated: seen again next scan
			continue
		}
		srcNode := rp.c.state.Nodes[src.Node]
		if srcNode == nil || srcNode.Addr == "" {
			continue
		}
		peers := rp.peersOf(src.Node, want)
		if len(peers) < want {
			if live < 0 {
				live = rp.liveLocked()
			}
			others := live // src is registered (srcNode above): not itself unless down
			if _, down := rp.c.down[src.Node]; !down {
				others--
			}
			if len(peers) < others {
				r.short = true // a live peer's order stream is not connected yet
			}
		}
		for _, peer := range peers {
			if have[peer] {
				continue
			}
			o := replicateOrder(j.ID, st.Step, &coordpb.ReplicateOrder{Rank: rank, WorldSize: st.WorldSize,
				SourceNode: src.Node, SourceAddr: srcNode.Addr, SizeBytes: src.Size, HeaderChecksum: src.Sum})
			rp.send(peer, o)
			r.pending[o.Id] = true
		}
	}
	if len(r.pending) == 0 {
		if r.short {
			rp.retryLater(j.ID, st.Step, now, false)
		} else {
			rp.replicated[j.ID] = st.Step
		}
		return
	}
	rp.steps[j.ID] = r
}

// liveLocked counts the registered nodes not declared down; the caller
// holds rp.c.mu.
func (rp *replication) liveLocked() int {
	n := 0
	for name := range rp.c.state.Nodes {
		if _, down := rp.c.down[name]; !down {
			n++
		}
	}
	return n
}

// send sends o, a replicate order, to peer, counting it in flight until
// its outcome is handled; the caller holds rp.mu and rp.c.mu.
func (rp *replication) send(peer string, o *coordpb.TransferOrder) {
	rp.ordered[replicaOf(o, peer)]++
	rp.c.streams.send(peer, o)
}

// replicaOf names the replica that o, a replicate order, makes on peer.
func replicaOf(o *coordpb.TransferOrder, peer string) replicaKey {
	r := o.GetReplicate()
	return replicaKey{rankKey{o.Job, r.GetRank()}, o.Step, r.GetHeaderChecksum(), peer}
}

// madeBy returns the peers that reported k's replica of step, with
// header checksum sum, made; the caller holds rp.mu.
func (rp *replication) madeBy(k rankKey, step int64, sum string) []string {
	if m := rp.made[k]; m.step == step && m.sum == sum {
		return m.peers
	}
	return nil
}

func replicateOrder(job string, step int64, r *coordpb.ReplicateOrder) *coordpb.TransferOrder {
	return &coordpb.TransferOrder{Job: job, Step: step, Order: &coordpb.TransferOrder_Replicate{Replicate: r}}
}

// peersOf returns the nodes that keep replicas of node's shards: connected
// agents, other failure domains first, then in ring order after node.
func (rp *replication) peersOf(node string, n int) []string {
	names := rp.c.streams.nodes()
	domain := func(x string) string {
		if ni := rp.c.state.Nodes[x]; ni != nil {
			return ni.FailureDomain
		}
		return ""
	}
	self := domain(node)
	ring := func(x string) int { // distance after node in name order
		i, _ := slices.BinarySearch(names, x)
		j, _ := slices.BinarySearch(names, node)
		return (i - j + len(names)) % len(names)
	}
	cands := slices.DeleteFunc(slices.Clone(names), func(x string) bool { return x == node })
	slices.SortFunc(cands, func(a, b string) int {
		sa, sb := domain(a) == self && self != "", domain(b) == self && self != ""
		if sa != sb {
			if sa {
				return 1
			}
			return -1
		}
		return cmp.Compare(ring(a), ring(b))
	})
	return cands[:min(n, len(cands))]
}

// outcome applies the outcome of a replicate order reported by node. The
// order is claimed under rp.mu, so that it is pending until its outcome is
// applied.
func (rp *replication) outcome(node string, ev *coordpb.TierEvent) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.closed {
		return
	}
	if od := rp.c.streams.claim(node, ev); od != nil {
		rp.handle(od, ev)
	} // else an order of an earlier run, or a duplicate report
}

// lost fails node's replicate orders that are lost (claimLost): s, a
// stream that ended, was sent them and never reported, or no stream of
// node will take them.
func (rp *replication) lost(node string, s *subscriber, why string) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.closed {
		return
	}
	for _, od := range rp.c.streams.claimLost(node, s, coordpb.OrderKind_ORDER_KIND_REPLICATE) {
		rp.handle(od, lostEvent(od, why))
	}
}

// handle applies the outcome of od, a replicate order. The caller holds
// rp.mu.
func (rp *replication) handle(od *order, ev *coordpb.TierEvent) {
	rp.m.transfers.WithLabelValues("shm", coordpb.OrderKind_ORDER_KIND_REPLICATE.Label(), okResult(ev.Ok)).Inc()
	rp.m.bytes.WithLabelValues("shm").Add(float64(ev.Bytes))
	rk := replicaOf(od.o, od.node)
	if rp.ordered[rk] > 1 {
		rp.ordered[rk]--
	} else {
		delete(rp.ordered, rk)
	}
	if ev.Ok {
		k, m := rk.rankKey, rp.made[rk.rankKey]
		if m.step != rk.step || m.sum != rk.sum {
			m = madeReplicas{step: rk.step, sum: rk.sum}
		}
		if !slices.Contains(m.peers, od.node) {
			m.peers = append(m.peers, od.node)
		}
		rp.made[k] = m
	}
	if !rp.commitReplicaDone(ev.Order, ev) {
		rp.replicaDone(od.o.Job, ev.Order, ev)
	}
}

// replicaDone records the outcome of a replicate order of a step.
func (rp *replication) replicaDone(job string, id uint64, ev *coordpb.TierEvent) {
	r := rp.steps[job]
	if r == nil || !r.pending[id] {
		return
	}
	delete(r.pending, id)
	if !ev.Ok {
		r.failed++
		rp.c.log.Warn("replica failed", "job", job, "step", ev.Step, "rank", ev.Rank, "err", ev.Error)
	}
	if len(r.pending) > 0 {
		return
	}
	delete(rp.steps, job)
	now := rp.c.cfg.Clock.Now()
	rp.m.replicaSeconds.Observe(now.Sub(r.started).Seconds())
	switch {
	case r.failed > 0 || r.short:
		rp.retryLater(job, r.step, now, r.failed > 0)
	default:
		delete(rp.retries, job)
		rp.replicated[job] = r.step
		rp.c.log.Debug("step replicated", "job", job, "step", r.step)
	}
}

// retryLater has the scan look at job's step again after a back-off and
// order its missing replicas: a try that failed counts, up to
// maxReplicaTries, when the step is left with the replicas it has (the
// job's next step is replicated anew); a rank left for later does not.
// The caller holds rp.mu.
func (rp *replication) retryLater(job string, step int64, now time.Time, failed bool) {
	rt := rp.retries[job]
	if rt.step != step {
		rt = replicaRetry{step: step}
	}
	if !failed {
		rt.after = now.Add(replicaRetryAfter)
		rp.retries[job] = rt
		return
	}
	rt.tries++
	if rt.tries >= maxReplicaTries {
		delete(rp.retries, job)
		rp.replicated[job] = step
		rp.c.log.Warn("replicas of a step failed; the step keeps the copies it has", "job", job, "step", step, "tries", rt.tries)
		return
	}
	rt.after = now.Add(replicaRetryAfter << (rt.tries - 1))
	rp.retries[job] = rt
}

// Replication at commit: the scan above replicates a step once it is
// consistent, one step of a job at a time, so under load the newest
// replica trails the newest step. Each primary commit (a rank's shard on
// the node it runs on) is therefore also replicated as it is reported,
// one shard of a rank at a time: while a rank's replication runs, only its
// newest commit waits, and older ones are skipped. The scan remains for
// what this misses (a full queue, a peer that was not connected).

// commitRec is a primary commit to replicate.
type commitRec struct {
	job       string
	rank, ws  uint32
	step      int64
	node, sum string
	size      uint64
}

type rankKey struct {
	job  string
	rank uint32
}

// noteCommits queues the primary shared-memory commits of applied records
// for replication; it never blocks (the caller holds the index lock).
func (rp *replication) noteCommits(recs []Record) {
	for _, r := range recs {
		if r.State != CopyCommitted || r.tier() != "shm" {
			continue
		}
		select {
		case rp.commits <- commitRec{job: r.Job, rank: r.Rank, ws: r.WorldSize, step: r.Step, node: r.Node, sum: r.Sum, size: r.Size}:
		default: // the scan replicates the step once it is consistent
		}
	}
}

// replicateCommits runs until ctx ends, replicating queued commits.
func (rp *replication) replicateCommits(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case cr := <-rp.commits:
			rp.mu.Lock()
			k := rankKey{cr.job, cr.rank}
			if rp.rankRepl[k] != 0 {
				rp.rankNext[k] = cr // newer than what waited: replace it
			} else {
				rp.replicateCommit(cr)
			}
			rp.mu.Unlock()
		}
	}
}

// replicateCommit orders the replicas of one primary commit; the caller
// holds rp.mu.
func (rp *replication) replicateCommit(cr commitRec) {
	rp.c.mu.Lock()
	defer rp.c.mu.Unlock()
	j := rp.c.state.Jobs[cr.job]
	src := rp.c.state.Nodes[cr.node]
	if j == nil || j.Placement[cr.rank] != cr.node || src == nil || src.Addr == "" || rp.closed {
		return // a replica's own commit, or an unknown node
	}
	k := rankKey{cr.job, cr.rank}
	have := map[string]bool{}
	if st := j.Steps[cr.step]; st != nil {
		for _, cp := range st.Copies[cr.rank] {
			if cp.Tier == "shm" && cp.Sum == cr.sum {
				have[cp.Node] = true
			}
		}
	}
	for _, p := range rp.madeBy(k, cr.step, cr.sum) { // made, not indexed yet
		have[p] = true
	}
	for _, peer := range rp.peersOf(cr.node, rp.replicas(cr.job)) {
		if have[peer] || rp.ordered[replicaKey{k, cr.step, cr.sum, peer}] > 0 {
			continue
		}
		o := replicateOrder(cr.job, cr.step, &coordpb.ReplicateOrder{Rank: cr.rank, WorldSize: cr.ws,
			SourceNode: cr.node, SourceAddr: src.Addr, SizeBytes: cr.size, HeaderChecksum: cr.sum})
		rp.send(peer, o)
		rp.rankRepl[k]++
		rp.commitOrders[o.Id] = k
	}
}

// commitReplicaDone records the end of a commit's replica order and starts
// the rank's waiting commit, if any; the caller holds rp.mu.
func (rp *replication) commitReplicaDone(id uint64, ev *coordpb.TierEvent) bool {
	k, ok := rp.commitOrders[id]
	if !ok {
		return false
	}
	delete(rp.commitOrders, id)
	if !ev.Ok {
		rp.c.log.Debug("replica of a commit failed", "job", k.job, "rank", k.rank, "step", ev.Step, "err", ev.Error)
	}
	if rp.rankRepl[k]--; rp.rankRepl[k] > 0 {
		return true
	}
	delete(rp.rankRepl, k)
	if next, ok := rp.rankNext[k]; ok {
		delete(rp.rankNext, k)
		rp.replicateCommit(next)
	}
	return true
}
