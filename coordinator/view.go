package coordinator

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// Reads of a whole step (listing, inspecting, planning a restore) cost
// O(world size). They copy what they need out of the index a bounded
// piece at a time, taking c.mu for at most viewChunk ranks' copies per
// hold, and do the rest (sorting, costing, building answers) outside it,
// so that a large job's reads never stall Latest, reports or
// registrations of the others (DESIGN invariant 10). They check their
// request's context as they go, and stop when it is over.

// viewChunk is how many ranks' copies a view copies per hold of c.mu.
const viewChunk = 2048

// ctxEvery is how many ranks or copies a long loop outside the lock
// handles between checks of its request's context.
const ctxEvery = 4096

// errStepChanged is a view abandoned because its step left the index (or
// was replaced) while it was being copied.
var errStepChanged = fmt.Errorf("%w: coordinator: the step left the index while being read", ErrNotFound)

// stepView is a step as copied out of the index. Its copies are shared
// with the index, which never changes a Copy once recorded (a change
// replaces it); their slices are the view's own. Copied a piece at a time,
// it may show a step's copies as they were at slightly different moments:
// a copy recorded meanwhile may be missing, one removed meanwhile present
// (a restore falls back from it as from any copy that fails).
type stepView struct {
	Job          string
	Step         int64
	WorldSize    uint32
	State        StepState
	ConsistentAt time.Time
	ranks        uint32  // ranks with a copy
	copies       []*Copy // grouped by rank, each rank's in the index's order
	sorted       bool    // the groups are in rank order
	bad          []*Copy // the copies found corrupt (few: copied in the first hold)
	unrestorable *Unrestorable
	epoch        uint64
}

// view copies job's step n out of the index, locking c.mu for at most
// viewChunk ranks at a time. want, when set, is asked under the first
// hold whether the step is wanted at all (nil view, no error, if not).
// rank >= 0 copies only that rank's copies.
func (c *Coordinator) view(ctx context.Context, job string, n, rank int64, want func(*Step) bool) (*stepView, error) {
	lookup := func() (*Step, error) { return c.stepLocked(job, n) }
	c.mu.Lock()
	st, err := lookup()
	if err != nil || want != nil && !want(st) {
		c.mu.Unlock()
		return nil, err
	}
	v := &stepView{Job: st.Job, Step: st.Step, WorldSize: st.WorldSize, State: st.State, ConsistentAt: st.ConsistentAt, ranks: uint32(len(st.Copies)), epoch: st.Epoch,
		unrestorable: st.Unrestorable}
	for r, cs := range st.Bad {
		if rank < 0 || uint32(rank) == r {
			v.bad = append(v.bad, cs...)
		}
	}
	switch {
	case rank >= 0:
		v.copies, v.sorted = slices.Clone(st.Copies[uint32(rank)]), true
		c.mu.Unlock()
		return v, nil
	case len(st.Copies) <= viewChunk: // few ranks hold copies: one hold
		for _, cs := range st.Copies {
			v.copies = append(v.copies, cs...)
		}
		c.mu.Unlock()
		return v, nil
	}
	c.mu.Unlock()
	v.ranks, v.sorted = 0, true
	for lo := uint32(0); lo < v.WorldSize; lo += viewChunk {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("coordinator: reading job %s step %d: %w", job, n, err)
		}
		c.mu.Lock()
		if now, _ := lookup(); now != st {
			c.mu.Unlock()
			return nil, errStepChanged
		}
		for r := lo; r < min(lo+viewChunk, v.WorldSize); r++ {
			if cs := st.Copies[r]; len(cs) > 0 {
				v.copies = append(v.copies, cs...)
				v.ranks++
			}
		}
		c.mu.Unlock()
	}
	return v, nil
}

// stepLocked returns job's step n from the index; the caller holds c.mu.
func (c *Coordinator) stepLocked(job string, n int64) (*Step, error) {
	j := c.state.Jobs[job]
	if j == nil {
		return nil, fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
	}
	st := j.Steps[n]
	if st == nil {
		return nil, fmt.Errorf("%w: coordinator: job %s has no step %d", ErrNotFound, job, n)
	}
	return st, nil
}

// byRank returns the copies sorted by rank, each rank's keeping their
// order.
func (v *stepView) byRank() []*Copy {
	if !v.sorted {
		slices.SortStableFunc(v.copies, func(a, b *Copy) int { return cmp.Compare(a.Rank, b.Rank) })
		v.sorted = true
	}
	return v.copies
}

// ordered returns the copies in rank order, the ones found corrupt
// among them, each after its rank's others.
func (v *stepView) ordered() []*Copy {
	cs := v.byRank()
	if len(v.bad) > 0 {
		cs = slices.Concat(cs, v.bad)
		slices.SortStableFunc(cs, func(a, b *Copy) int { return cmp.Compare(a.Rank, b.Rank) })
	}
	return cs
}

// complete reports whether every rank has a copy.
func (v *stepView) complete() bool { return v.ranks == v.WorldSize }

// proto returns the step as the API shows it, copies in rank order (the
// ones found corrupt among them, so marked).
func (v *stepView) proto(ctx context.Context) (*coordpb.Step, error) {
	p := v.head()
	cs := v.ordered()
	p.Copies = make([]*coordpb.Copy, len(cs))
	for i, cp := range cs {
		if i%ctxEvery == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("coordinator: reading job %s step %d: %w", v.Job, v.Step, ctx.Err())
		}
		p.Copies[i] = copyProto(cp)
	}
	return p, nil
}

// head returns the step as the API shows it, without its copies.
func (v *stepView) head() *coordpb.Step {
	p := &coordpb.Step{Job: v.Job, Step: v.Step, WorldSize: v.WorldSize, State: v.State.proto(), RanksCommitted: v.ranks, Epoch: v.epoch}
	if !v.ConsistentAt.IsZero() {
		p.ConsistentUnixNano = v.ConsistentAt.UnixNano()
	}
	if v.unrestorable != nil {
		p.Unrestorable = v.unrestorable.proto(v.Step)
	}
	return p
}

// viewPlacement copies job's placement (rank -> node) out of the index,
// locking c.mu for at most viewChunk ranks at a time.
func (c *Coordinator) viewPlacement(ctx context.Context, job string) (map[uint32]string, error) {
	c.mu.Lock()
	j := c.state.Jobs[job]
	if j == nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
	}
	if len(j.Placement) <= viewChunk {
		defer c.mu.Unlock()
		return maps.Clone(j.Placement), nil
	}
	world := j.WorldSize
	c.mu.Unlock()
	out := make(map[uint32]string, world)
	for lo := uint32(0); lo < world; lo += viewChunk {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("coordinator: reading job %s's placement: %w", job, err)
		}
		c.mu.Lock()
		if c.state.Jobs[job] != j || j.WorldSize != world {
			c.mu.Unlock()
			return nil, fmt.Errorf("%w: coordinator: job %s left the index or changed its world size while being read", ErrRefused, job)
		}
		for r := lo; r < min(lo+viewChunk, world); r++ {
			if n, ok := j.Placement[r]; ok {
				out[r] = n
			}
		}
		c.mu.Unlock()
	}
	return out, nil
}

// nodeView is what a restore plan needs of the nodes, copied out of the
// index: which are down, and their failure domains.
type nodeView struct {
	down    map[string]bool
	domains map[string]string
}

// viewNodes copies the nodes' state; the caller holds c.mu. O(nodes).
func (c *Coordinator) viewNodes() nodeView {
	nv := nodeView{down: make(map[string]bool, len(c.down)), domains: make(map[string]string, len(c.state.Nodes))}
	for n := range c.down {
		nv.down[n] = true
	}
	for n, info := range c.state.Nodes {
		if info.FailureDomain != "" {
			nv.domains[n] = info.FailureDomain
		}
	}
	return nv
}

// live reports whether a copy can be read: it is on a shared tier, or its
// node is not down.
func (nv nodeView) live(cp *Copy) bool { return cp.Node == sharedNode || !nv.down[cp.Node] }

func (nv nodeView) sameDomain(a, b string) bool {
	d := nv.domains[a]
	return d != "" && d == nv.domains[b]
}

// restorable reports whether every rank of the consistent, complete step
// v has a copy that can be read. With no node down every copy can be.
func (v *stepView) restorable(ctx context.Context, nv nodeView) (bool, error) {
	if v.State != Consistent || !v.complete() {
		return false, nil
	}
	if len(nv.down) == 0 {
		return true, nil
	}
	ok := make([]bool, v.WorldSize)
	n := uint32(0)
	for i, cp := range v.copies {
		if i%ctxEvery == 0 && ctx.Err() != nil {
			return false, ctx.Err()
		}
		if cp.Rank < v.WorldSize && !ok[cp.Rank] && nv.live(cp) {
			ok[cp.Rank] = true
			n++
		}
	}
	return n == v.WorldSize, nil
}

// rankPlan returns rank's live copies among cs, cheapest first for
// target.
func (nv nodeView) rankPlan(rank uint32, target string, cs []*Copy) *coordpb.RankPlan {
	srcs := make([]*Copy, 0, len(cs))
	for _, cp := range cs {
		if nv.live(cp) {
			srcs = append(srcs, cp)
		}
	}
	slices.SortStableFunc(srcs, func(a, b *Copy) int {
		return sourceCost(a, target, nv.sameDomain) - sourceCost(b, target, nv.sameDomain)
	})
	rp := &coordpb.RankPlan{Rank: rank, TargetNode: target}
	for _, cp := range srcs {
		rp.Sources = append(rp.Sources, copyProto(cp))
	}
	return rp
}

// noCopyNamed is how many of a passed-over step's ranks with no copy
// left its explanation names (each names how many there are in all).
const noCopyNamed = 8

// passedOver says why a consistent step a restore passes over cannot be
// restored whole now: each rank without a live good copy, with its copies
// on nodes that are down and those found corrupt, and the ranks with no
// copy left at all (their slots reused, their tier copies deleted; the
// first noCopyNamed of them named). Nil when every rank has a live copy
// (the step is restorable).
func (v *stepView) passedOver(nv nodeView, at time.Time) *coordpb.UnrestorableStep {
	if v.State != Consistent {
		return nil
	}
	type why struct {
		live  bool
		fails []CopyFailure
	}
	ranks := map[uint32]*why{}
	get := func(r uint32) *why {
		if ranks[r] == nil {
			ranks[r] = &why{}
		}
		return ranks[r]
	}
	for _, cp := range v.copies {
		w := get(cp.Rank)
		if nv.live(cp) {
			w.live = true
			continue
		}
		w.fails = append(w.fails, CopyFailure{Copy: cp.Tier + ":" + cp.Node, Error: "node " + cp.Node + " is down"})
	}
	for _, cp := range v.bad {
		w := get(cp.Rank)
		w.fails = append(w.fails, CopyFailure{Copy: cp.Tier + ":" + cp.Node, Error: "its checksum did not match", Corrupt: true})
	}
	var none []uint32
	for r := range v.WorldSize {
		if ranks[r] == nil {
			none = append(none, r)
		}
	}
	for _, r := range none[:min(len(none), noCopyNamed)] {
		get(r).fails = []CopyFailure{{Error: fmt.Sprintf("no copy left (%d of %d ranks have none)", len(none), v.WorldSize)}}
	}
	u := Unrestorable{At: at}
	for r, w := range ranks {
		if !w.live && len(w.fails) > 0 {
			u.Ranks = append(u.Ranks, RankFailure{Rank: r, Copies: w.fails})
		}
	}
	if len(u.Ranks) == 0 {
		return nil
	}
	slices.SortFunc(u.Ranks, func(a, b RankFailure) int { return cmp.Compare(a.Rank, b.Rank) })
	return u.proto(v.Step)
}
