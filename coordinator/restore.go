package coordinator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// PlanRestore returns, for every rank of a consistent step (the newest
// restorable one when step < 0), where the rank runs and its copies,
// cheapest first. Copies on nodes that are down, and copies found
// corrupt, are left out; the newest restorable step is the newest
// consistent step whose every rank has a copy that is neither, and that
// no restore found unrestorable (those it passes over are listed in the
// plan's skipped).
func (c *Coordinator) PlanRestore(ctx context.Context, job string, step int64) (*coordpb.PlanRestoreResponse, error) {
	return c.plan(ctx, job, step, nil)
}

// anyStep is the bound of a choice of the newest restorable step that
// leaves every step in.
const anyStep = math.MaxInt64

// plan is PlanRestore onto placement (rank -> node); nil keeps the job's.
// The index is locked only to copy what the plan needs (view.go).
func (c *Coordinator) plan(ctx context.Context, job string, step int64, placement map[uint32]string) (*coordpb.PlanRestoreResponse, error) {
	return c.planBelow(ctx, job, step, anyStep, placement)
}

// planBelow is plan, choosing (when step < 0) among the steps older than
// below only.
func (c *Coordinator) planBelow(ctx context.Context, job string, step, below int64, placement map[uint32]string) (*coordpb.PlanRestoreResponse, error) {
	v, nv, place, skipped, err := c.chooseStep(ctx, job, step, below, -1, placement == nil)
	if err != nil {
		return nil, err
	}
	if placement == nil {
		placement = place
	}
	plan := &coordpb.PlanRestoreResponse{Job: job, Step: v.Step, Ranks: make([]*coordpb.RankPlan, 0, v.WorldSize), Skipped: skipped}
	cs := v.byRank()
	i := 0
	for r := range v.WorldSize {
		if r%ctxEvery == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("coordinator: planning a restore of job %s: %w", job, ctx.Err())
		}
		k := i
		for k < len(cs) && cs[k].Rank == r {
			k++
		}
		plan.Ranks = append(plan.Ranks, nv.rankPlan(r, placement[r], cs[i:k]))
		i = k
	}
	return plan, nil
}

// chooseStep finds the step a restore of job uses (step, or the newest
// restorable one when step < 0) and returns a copy of it, of the nodes'
// state, and, with wantPlacement, of the job's placement, and the newer
// steps it passed over because a restore found them unrestorable. The
// index is locked to copy, one step at a time; the O(world size) check
// that every rank has a live copy runs outside it. rank >= 0 copies only
// that rank's copies when no node is down (then every copy is live, and a
// consistent, complete step is restorable as it stands). A newest step is
// chosen among those older than below.
func (c *Coordinator) chooseStep(ctx context.Context, job string, step, below, rank int64, wantPlacement bool) (*stepView, nodeView, map[uint32]string, []*coordpb.UnrestorableStep, error) {
	c.mu.Lock()
	if step < 0 { // the newest restorable step: not before the index caught up
		if err := c.rebuildingLocked(job); err != nil {
			c.mu.Unlock()
			return nil, nodeView{}, nil, nil, err
		}
	}
	j := c.state.Jobs[job]
	if j == nil {
		c.mu.Unlock()
		return nil, nodeView{}, nil, nil, fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
	}
	latest := j.Latest
	var candidates []int64 // newest first
	var marked []*coordpb.UnrestorableStep
	var spoilt []int64 // consistent, but some rank has no good copy left (found corrupt, or gone)
	if step >= 0 {
		candidates = []int64{step}
	} else {
		for n, st := range j.Steps {
			switch {
			case st.State != Consistent:
			case st.Unrestorable != nil:
				marked = append(marked, st.Unrestorable.proto(n))
			case !st.complete(): // some rank has no copy, or only corrupt ones
				spoilt = append(spoilt, n)
			case n >= below: // passed over by the restore asking
			default:
				candidates = append(candidates, n)
			}
		}
		slices.SortFunc(candidates, func(a, b int64) int { return cmp.Compare(b, a) })
		slices.SortFunc(marked, func(a, b *coordpb.UnrestorableStep) int { return cmp.Compare(b.Step, a.Step) })
	}
	nv := c.viewNodes()
	c.mu.Unlock()
	newer := func(than int64) []*coordpb.UnrestorableStep {
		return slices.DeleteFunc(slices.Clone(marked), func(u *coordpb.UnrestorableStep) bool { return u.Step <= than })
	}
	var placement map[uint32]string
	if wantPlacement {
		var err error
		if placement, err = c.viewPlacement(ctx, job); err != nil {
			return nil, nodeView{}, nil, nil, err
		}
	}
	var passed []*coordpb.UnrestorableStep // why each step passed over is not restorable now
	for _, n := range candidates {
		if err := ctx.Err(); err != nil {
			return nil, nodeView{}, nil, nil, fmt.Errorf("coordinator: planning a restore of job %s: %w", job, err)
		}
		r := rank
		if len(nv.down) > 0 { // every rank's copies, to see which are live
			r = -1
		}
		v, err := c.view(ctx, job, n, r, func(st *Step) bool {
			return st.State == Consistent && st.complete() && (step >= 0 || st.Unrestorable == nil)
		})
		switch {
		case errors.Is(err, ErrNotFound): // gone since
			continue
		case err != nil:
			return nil, nodeView{}, nil, nil, err
		case v == nil: // no longer consistent and complete, or found unrestorable meanwhile
			spoilt = append(spoilt, n)
			continue
		}
		ok, err := v.restorable(ctx, nv)
		if err != nil {
			return nil, nodeView{}, nil, nil, fmt.Errorf("coordinator: planning a restore of job %s: %w", job, err)
		}
		if ok {
			skipped := append(newer(v.Step), passed...)
			skipped = append(skipped, c.explainSpoilt(ctx, job, spoilt, v.Step, nv)...)
			slices.SortFunc(skipped, func(a, b *coordpb.UnrestorableStep) int { return cmp.Compare(b.Step, a.Step) })
			return v, nv, placement, slices.CompactFunc(skipped, func(a, b *coordpb.UnrestorableStep) bool { return a.Step == b.Step }), nil
		}
		if p := v.passedOver(nv, c.cfg.Clock.Now()); p != nil {
			passed = append(passed, p)
		}
	}
	if step < 0 && len(marked) > 0 {
		return nil, nodeView{}, nil, nil, fmt.Errorf("%w: coordinator: job %s has no restorable step: no consistent step with a live copy of every rank (none found corrupt) but those passed over as found unrestorable: %s",
			ErrNotFound, job, skippedText(marked))
	}
	if step < 0 {
		return nil, nodeView{}, nil, nil, fmt.Errorf("%w: coordinator: job %s has no consistent step with a live copy of every rank (none found corrupt)", ErrNotFound, job)
	}
	return nil, nodeView{}, nil, nil, fmt.Errorf("%w: coordinator: job %s step %d is not restorable (not consistent, or some rank has no copy on a live node that is not corrupt); the latest consistent step is %d",
		ErrRefused, job, step, latest)
}

// RankSources returns where rank's shard of step (the newest restorable
// step when step < 0) can come from for the rank running on node: its live
// copies, cheapest first for that node, with each node's agent address.
func (c *Coordinator) RankSources(ctx context.Context, job string, step int64, rank uint32, node string) (*coordpb.RankSourcesResponse, error) {
	c.mu.Lock()
	j := c.state.Jobs[job]
	if j == nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
	}
	// A rank of the step's world size, which may not be the job's: after
	// an elastic restart, the new gang reads every rank of the step it
	// resharded from.
	addrs := c.agentAddrsLocked()
	c.mu.Unlock()
	v, nv, _, _, err := c.chooseStep(ctx, job, step, anyStep, int64(rank), false)
	if err != nil {
		return nil, err
	}
	if rank >= v.WorldSize {
		return nil, fmt.Errorf("%w: coordinator: job %s step %d has %d ranks, not rank %d", ErrInvalid, job, v.Step, v.WorldSize, rank)
	}
	var cs []*Copy
	for _, cp := range v.byRank() {
		if cp.Rank == rank {
			cs = append(cs, cp)
		}
	}
	rp := nv.rankPlan(rank, node, cs)
	if len(rp.Sources) == 0 {
		return nil, fmt.Errorf("%w: coordinator: job %s step %d rank %d has no live copy", ErrNotFound, job, v.Step, rank)
	}
	resp := &coordpb.RankSourcesResponse{WorldSize: v.WorldSize, SizeBytes: rp.Sources[0].SizeBytes,
		HeaderChecksum: rp.Sources[0].HeaderChecksum}
	for _, s := range rp.Sources {
		resp.Sources = append(resp.Sources, &coordpb.RankSource{Tier: s.Tier, Node: s.Node, Addr: addrs[s.Node]})
	}
	return resp, nil
}

// agentAddrsLocked returns every known node's agent address, by node; the
// caller holds c.mu.
func (c *Coordinator) agentAddrsLocked() map[string]string {
	addrs := make(map[string]string, len(c.state.Nodes))
	for _, n := range c.state.Nodes {
		addrs[n.Name] = n.Addr
	}
	return addrs
}

// Restore restores step of job (the newest restorable one when step < 0,
// falling back past steps that cannot be restored whole: stage.go) into
// the memory of the nodes its ranks run on, without restarting them:
// every rank is staged, then all are switched at once, or none is. The
// plan says, per rank, what served and what failed, and which steps were
// passed over; the restore is logged with who asked.
func (c *Coordinator) Restore(ctx context.Context, job string, step int64, who string) (*coordpb.PlanRestoreResponse, error) {
	lock := c.jobLock(job)
	lock.Lock()
	defer lock.Unlock()
	plan, stage, err := c.restore(ctx, job, step, nil, nil, nil)
	if err != nil {
		c.log.Warn("restore", "job", job, "step", step, "requested_by", who, "ok", false, "err", err)
		return nil, err
	}
	if plan.Ok {
		if failed := c.finishOn(ctx, plan, stage, true); len(failed) > 0 {
			// The nodes that did switch hold one more copy of the step.
			_ = c.finishStage(context.WithoutCancel(ctx), plan, stage, false)
			plan.Ok = false
			for _, rp := range plan.Ranks {
				if err := failed[rp.TargetNode]; err != nil {
					rp.Error = "switching to the staged shard: " + err.Error()
				}
			}
		}
	}
	used := map[string]int{}
	var bytes uint64
	for _, rp := range plan.Ranks {
		used[rp.Used]++
		bytes += rp.Bytes
	}
	c.log.Info("restore", "job", plan.Job, "step", plan.Step, "requested_by", who, "ok", plan.Ok, "ranks", len(plan.Ranks),
		"bytes", bytes, "seconds", time.Duration(plan.Nanos).Seconds(), "sources", fmt.Sprint(used), "skipped", skippedText(plan.Skipped))
	return plan, nil
}

// explainSpoilt says why each of the consistent steps newer than chosen
// that is not restorable whole (a rank's copies found corrupt or gone, or
// the step found unrestorable while the restore was being planned)
// cannot be restored: a restore that passes over a step names it and why.
func (c *Coordinator) explainSpoilt(ctx context.Context, job string, spoilt []int64, chosen int64, nv nodeView) []*coordpb.UnrestorableStep {
	var out []*coordpb.UnrestorableStep
	for _, n := range spoilt {
		if n <= chosen || ctx.Err() != nil {
			continue
		}
		v, err := c.view(ctx, job, n, -1, func(st *Step) bool { return st.State == Consistent })
		switch {
		case err != nil || v == nil:
		case v.unrestorable != nil:
			out = append(out, v.unrestorable.proto(n))
		default:
			if p := v.passedOver(nv, c.cfg.Clock.Now()); p != nil {
				out = append(out, p)
			}
		}
	}
	return out
}
