package coordinator

import (
	"cmp"
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
		if src == nil {
			continue
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
