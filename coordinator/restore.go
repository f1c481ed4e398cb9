package coordinator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
)

// maxRestoreCalls bounds the agents fetching at once during a restore.
const maxRestoreCalls = 64

// Restore runs a restore plan: the agent of each rank's node fetches the
// rank's shard from its sources in the plan's order, verifying it and
// falling back to the next source on any error. It fills in, per rank,
// what served and what failed, and logs who asked.
func (c *Coordinator) Restore(ctx context.Context, plan *coordpb.PlanRestoreResponse, who string) {
	start := time.Now()
	c.mu.Lock()
	addrs := c.agentAddrsLocked()
	c.mu.Unlock()
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxRestoreCalls)
	for _, rp := range plan.Ranks {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c.restoreRank(ctx, plan, rp, addrs)
		})
	}
	wg.Wait()
	plan.Executed, plan.Ok, plan.Nanos = true, true, time.Since(start).Nanoseconds()
	used := map[string]int{}
	var bytes uint64
	for _, rp := range plan.Ranks {
		plan.Ok = plan.Ok && rp.Error == ""
		used[rp.Used]++
		bytes += rp.Bytes
	}
	c.log.Info("restore", "job", plan.Job, "step", plan.Step, "requested_by", who, "ok", plan.Ok,
		"ranks", len(plan.Ranks), "bytes", bytes, "seconds", time.Since(start).Seconds(), "sources", fmt.Sprint(used))
}

func (c *Coordinator) restoreRank(ctx context.Context, plan *coordpb.PlanRestoreResponse, rp *coordpb.RankPlan, addrs map[string]string) {
	start := time.Now()
	defer func() { rp.Nanos = time.Since(start).Nanoseconds() }()
	if rp.TargetNode == "" || len(rp.Sources) == 0 {
		rp.Error = fmt.Sprintf("rank %d has no node to run on or no copy", rp.Rank)
		return
	}
	req := &agentpb.FetchRequest{Job: plan.Job, Rank: rp.Rank, Step: plan.Step, WorldSize: uint32(len(plan.Ranks)),
		SizeBytes: rp.Sources[0].SizeBytes, HeaderChecksum: rp.Sources[0].HeaderChecksum}
	for _, s := range rp.Sources {
		req.Sources = append(req.Sources, &agentpb.FetchSource{Tier: s.Tier, Node: s.Node, Addr: addrs[s.Node]})
	}
	err := c.agentCall(ctx, rp.TargetNode, func(ctx context.Context, a agentpb.AgentClient) error {
		resp, err := a.Fetch(ctx, req)
		if err != nil {
			return err
		}
		rp.Used, rp.Bytes = resp.Tier, resp.SizeBytes
		for _, f := range resp.Failed {
			rp.Failed = append(rp.Failed, f.Tier+": "+f.Error)
		}
		return nil
	})
	if err != nil {
		rp.Error = err.Error()
	}
}

// PlanRestore returns, for every rank of a consistent step (the newest
// restorable one when step < 0), where the rank runs and its copies,
// cheapest first. Copies on nodes that are down are left out; the newest
// restorable step is the newest consistent step whose every rank has a
// copy that is not.
func (c *Coordinator) PlanRestore(job string, step int64) (*coordpb.PlanRestoreResponse, error) {
	return c.plan(job, step, nil)
}

// plan is PlanRestore onto placement (rank -> node); nil keeps the job's.
func (c *Coordinator) plan(job string, step int64, placement map[uint32]string) (*coordpb.PlanRestoreResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.state.Jobs[job]
	if j == nil {
		return nil, fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
	}
	if placement == nil {
		placement = j.Placement
	}
	var st *Step
	if step < 0 {
		steps := j.SortedSteps()
		for i := len(steps) - 1; i >= 0 && st == nil; i-- {
			if c.restorable(steps[i]) {
				st = steps[i]
			}
		}
		if st == nil {
			return nil, fmt.Errorf("%w: coordinator: job %s has no consistent step with a live copy of every rank", ErrNotFound, job)
		}
	} else if st = j.Steps[step]; st == nil || !c.restorable(st) {
		return nil, fmt.Errorf("%w: coordinator: job %s step %d is not restorable (not consistent, or some rank has no copy on a live node); the latest consistent step is %d",
			ErrRefused, job, step, j.Latest)
	}
	plan := &coordpb.PlanRestoreResponse{Job: job, Step: st.Step}
	for r := range st.WorldSize {
		target := placement[r]
		srcs := slices.DeleteFunc(slices.Clone(st.Copies[r]), func(cp *Copy) bool { return !c.live(cp) })
		slices.SortStableFunc(srcs, func(a, b *Copy) int {
			return c.sourceCost(a, target) - c.sourceCost(b, target)
		})
		rp := &coordpb.RankPlan{Rank: r, TargetNode: target}
		for _, cp := range srcs {
			rp.Sources = append(rp.Sources, copyProto(cp))
		}
		plan.Ranks = append(plan.Ranks, rp)
	}
	return plan, nil
}

// restorable reports whether every rank of a consistent step has a copy
// on a live node or a shared tier; the caller holds c.mu.
func (c *Coordinator) restorable(st *Step) bool {
	if st.State != Consistent || !st.complete() {
		return false
	}
	for r := range st.WorldSize {
		if !slices.ContainsFunc(st.Copies[r], c.live) {
			return false
		}
	}
	return true
}

// live reports whether a copy can be read: it is on a shared tier, or its
// node is not down. The caller holds c.mu.
func (c *Coordinator) live(cp *Copy) bool {
	if cp.Node == sharedNode {
		return true
	}
	_, down := c.down[cp.Node]
	return !down
}

// RankSources returns where rank's shard of step (the newest restorable
// step when step < 0) can come from for the rank running on node: its live
// copies, cheapest first for that node, with each node's agent address.
func (c *Coordinator) RankSources(job string, step int64, rank uint32, node string) (*coordpb.RankSourcesResponse, error) {
	c.mu.Lock()
	j := c.state.Jobs[job]
	if j == nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
	}
	if rank >= j.WorldSize {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: coordinator: job %s has %d ranks, not rank %d", ErrInvalid, job, j.WorldSize, rank)
	}
	placement := maps.Clone(j.Placement)
	placement[rank] = node
	addrs := c.agentAddrsLocked()
	c.mu.Unlock()
	plan, err := c.plan(job, step, placement)
	if err != nil {
		return nil, err
	}
	rp := plan.Ranks[rank]
	if len(rp.Sources) == 0 {
		return nil, fmt.Errorf("%w: coordinator: job %s step %d rank %d has no live copy", ErrNotFound, job, plan.Step, rank)
	}
	resp := &coordpb.RankSourcesResponse{WorldSize: uint32(len(plan.Ranks)), SizeBytes: rp.Sources[0].SizeBytes,
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
