package coordinator

import (
	"cmp"
	"context"
	"maps"
	"slices"
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

// replication is a job's replication in flight.
type replication struct {
	step    int64
	pending map[uint64]bool // order ids not yet reported
	failed  int
	started time.Time
}

// replicas returns how many peer copies a job keeps.
func (t *tierer) replicas(job string) int {
	if n, ok := t.jobReplicas[job]; ok {
		return n
	}
	return t.c.cfg.Replicas
}

// replicate starts the replication of job's latest consistent step when
// it is not replicated yet; the caller holds t.mu and t.c.mu.
func (t *tierer) replicate(j *Job) {
	want := t.replicas(j.ID)
	if done, ok := t.replicated[j.ID]; want <= 0 || j.Latest < 0 || ok && done >= j.Latest || t.repl[j.ID] != nil {
		return
	}
	st := j.Steps[j.Latest]
	if st == nil || st.State != Consistent {
		return
	}
	r := &replication{step: st.Step, pending: map[uint64]bool{}, started: t.c.cfg.Clock.Now()}
	for rank := range st.WorldSize {
		var src *Copy
		have := map[string]bool{}
		for _, cp := range st.Copies[rank] {
			if cp.Tier == "shm" && cp.State == "committed" {
				have[cp.Node] = true
				if src == nil || cp.Node == j.Placement[rank] {
					src = cp
				}
			}
		}
		if src == nil || t.rankRepl[rankKey{j.ID, rank}] != 0 {
			continue // no copy, or its commit is being replicated
		}
		srcNode := t.c.state.Nodes[src.Node]
		if srcNode == nil || srcNode.Addr == "" {
			continue
		}
		for _, peer := range t.peersOf(src.Node, want) {
			if have[peer] {
				continue
			}
			o := &coordpb.TransferOrder{Kind: "replicate", Job: j.ID, Step: st.Step, Rank: rank, WorldSize: st.WorldSize,
				SourceNode: src.Node, SourceAddr: srcNode.Addr, SizeBytes: src.Size, HeaderChecksum: src.Sum}
			t.send(peer, o)
			r.pending[o.Id] = true
		}
	}
	if len(r.pending) == 0 {
		t.replicated[j.ID] = st.Step
		return
	}
	t.repl[j.ID] = r
}

// peersOf returns the nodes that keep replicas of node's shards: connected
// agents, other failure domains first, then in ring order after node.
func (t *tierer) peersOf(node string, n int) []string {
	names := slices.Sorted(maps.Keys(t.subs))
	domain := func(x string) string {
		if ni := t.c.state.Nodes[x]; ni != nil {
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

// replicaDone records a replicate order's outcome.
func (t *tierer) replicaDone(job string, id uint64, ev *coordpb.TierEvent) {
	r := t.repl[job]
	if r == nil || !r.pending[id] {
		return
	}
	delete(r.pending, id)
	if !ev.Ok {
		r.failed++
		t.c.log.Warn("replica failed", "job", job, "step", ev.Step, "rank", ev.Rank, "err", ev.Error)
	}
	if len(r.pending) > 0 {
		return
	}
	delete(t.repl, job)
	t.replicated[job] = r.step
	t.m.replicaSeconds.Observe(t.c.cfg.Clock.Now().Sub(r.started).Seconds())
	if r.failed == 0 {
		t.c.log.Debug("step replicated", "job", job, "step", r.step)
	}
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
func (t *tierer) noteCommits(recs []Record) {
	for _, r := range recs {
		if r.State != "committed" || r.tier() != "shm" {
			continue
		}
		select {
		case t.commits <- commitRec{job: r.Job, rank: r.Rank, ws: r.WorldSize, step: r.Step, node: r.Node, sum: r.Sum, size: r.Size}:
		default: // the scan replicates the step once it is consistent
		}
	}
}

// replicateCommits runs until ctx ends, replicating queued commits.
func (t *tierer) replicateCommits(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case cr := <-t.commits:
			t.mu.Lock()
			k := rankKey{cr.job, cr.rank}
			if t.rankRepl[k] != 0 {
				t.rankNext[k] = cr // newer than what waited: replace it
			} else {
				t.replicateCommit(cr)
			}
			t.mu.Unlock()
		}
	}
}

// replicateCommit orders the replicas of one primary commit; the caller
// holds t.mu.
func (t *tierer) replicateCommit(cr commitRec) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	j := t.c.state.Jobs[cr.job]
	src := t.c.state.Nodes[cr.node]
	if j == nil || j.Placement[cr.rank] != cr.node || src == nil || src.Addr == "" || t.closed {
		return // a replica's own commit, or an unknown node
	}
	have := map[string]bool{}
	if st := j.Steps[cr.step]; st != nil {
		for _, cp := range st.Copies[cr.rank] {
			if cp.Tier == "shm" && cp.Sum == cr.sum {
				have[cp.Node] = true
			}
		}
	}
	for _, peer := range t.peersOf(cr.node, t.replicas(cr.job)) {
		if have[peer] {
			continue
		}
		o := &coordpb.TransferOrder{Kind: "replicate", Job: cr.job, Step: cr.step, Rank: cr.rank, WorldSize: cr.ws,
			SourceNode: cr.node, SourceAddr: src.Addr, SizeBytes: cr.size, HeaderChecksum: cr.sum}
		t.send(peer, o)
		t.rankRepl[rankKey{cr.job, cr.rank}]++
		t.commitOrders[o.Id] = rankKey{cr.job, cr.rank}
	}
}

// commitReplicaDone records the end of a commit's replica order and starts
// the rank's waiting commit, if any; the caller holds t.mu.
func (t *tierer) commitReplicaDone(id uint64, ev *coordpb.TierEvent) bool {
	k, ok := t.commitOrders[id]
	if !ok {
		return false
	}
	delete(t.commitOrders, id)
	if !ev.Ok {
		t.c.log.Debug("replica of a commit failed", "job", k.job, "rank", k.rank, "step", ev.Step, "err", ev.Error)
	}
	if t.rankRepl[k]--; t.rankRepl[k] > 0 {
		return true
	}
	delete(t.rankRepl, k)
	if next, ok := t.rankNext[k]; ok {
		delete(t.rankNext, k)
		t.replicateCommit(next)
	}
	return true
}
