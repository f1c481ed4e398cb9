package coordinator

import (
	"context"
	"fmt"
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
	addrs := map[string]string{}
	c.mu.Lock()
	for _, n := range c.state.Nodes {
		addrs[n.Name] = n.Addr
	}
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
