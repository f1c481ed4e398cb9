package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/tiers"
)

// A restore is all or nothing (DESIGN invariant 8), an operator's and a
// recovery's alike:
//
//  1. plan a step (the newest restorable one unless one is asked for);
//  2. stage it: the agent of each rank's node fetches the rank's shard
//     from its sources in the plan's order into a fresh slot, verified,
//     and leaves it staged (agent/stage.go): nothing is served or
//     reported yet, and the rank's checkpoints stay as they were;
//  3. if every rank is staged, switch them all (FinishRestore with
//     commit), a change of slot states with no bytes to move;
//  4. if not, free every staged slot. A rank whose every source failed
//     (corrupt, unreadable) makes the step unrestorable: its corrupt tier
//     copies are marked so (they leave restore plans), the step is marked
//     with each failed copy and why (unrestorable.go), and, when no step
//     was asked for, the next older restorable step is tried from 2. A
//     rank that failed for a reason not the step's (its node's agent did
//     not answer, had no room) ends the restore there: an older step would
//     fail the same way.

// maxRestoreCalls bounds the agents fetching at once during a restore.
const maxRestoreCalls = 64

// maxFallback bounds the steps one restore tries.
const maxFallback = 16

// restore stages job's step (the newest restorable one when step < 0)
// onto placement (nil: the job's), falling back to older steps as the
// package comment says; first, when set, is the plan of the first step to
// try. fellBack, when set, is told each older step before it is staged (a
// recovery's abort moves there: the agents discard the steps after it,
// whose slots the older step's restore may need). It returns the plan
// with every rank staged (plan.Ok) and the stage to switch to or free; or
// a plan with ok false, every rank saying why and nothing staged; or an
// error when no step was left to try.
func (c *Coordinator) restore(ctx context.Context, job string, step int64, placement map[uint32]string, first *coordpb.PlanRestoreResponse,
	fellBack func(step int64) error) (*coordpb.PlanRestoreResponse, string, error) {
	start := time.Now()
	var found []*coordpb.UnrestorableStep  // by this restore, newest first
	var unsure []*coordpb.UnrestorableStep // of those, the ones not marked (a store did not serve)
	plan := first
	below := int64(anyStep) // a fallback tries steps older than those tried
	for try := 0; ; try++ {
		if plan == nil {
			p, err := c.planBelow(ctx, job, step, below, placement)
			if err != nil && len(unsure) > 0 {
				return nil, "", fmt.Errorf("%w; passed over for now, not marked (a store did not serve them): %s", err, skippedText(unsure))
			}
			if err != nil {
				return nil, "", err
			}
			plan = p
			if fellBack != nil {
				if err := fellBack(plan.Step); err != nil {
					return nil, "", err
				}
			}
		}
		if slices.ContainsFunc(found, func(u *coordpb.UnrestorableStep) bool { return u.Step == plan.Step }) {
			return nil, "", fmt.Errorf("coordinator: restore of job %s: step %d was found unrestorable, but the mark was not recorded: %s", job, plan.Step, skippedText(found))
		}
		for _, u := range found { // the marked ones listed by the plan already, unless the mark was lost
			if !slices.ContainsFunc(plan.Skipped, func(k *coordpb.UnrestorableStep) bool { return k.Step == u.Step }) {
				plan.Skipped = append(plan.Skipped, u)
			}
		}
		slices.SortFunc(plan.Skipped, func(a, b *coordpb.UnrestorableStep) int { return int(b.Step - a.Step) })
		stage := newStage()
		attempts := c.stageAll(ctx, plan, stage)
		plan.Executed, plan.Nanos = true, time.Since(start).Nanoseconds()
		c.checkUnread(job, plan.Step, attempts, targets(plan))
		if plan.Ok {
			return plan, stage, nil
		}
		if err := c.finishStage(context.WithoutCancel(ctx), plan, stage, false); err != nil {
			c.log.Warn("freeing a failed restore's staged shards", "job", job, "step", plan.Step, "err", err)
		}
		c.markCorrupt(plan, attempts)
		u := unrestorableFrom(plan, attempts, c.cfg.Clock.Now())
		if u == nil || ctx.Err() != nil {
			return plan, "", nil // not the step's fault: an older one would fail the same way
		}
		// A recovery's fallback discards the steps after the older one on
		// every node (fellBack): past a step that may restore once its
		// store is back, it would throw good copies away. The recovery
		// ends here instead, unmarked, and its next try plans afresh.
		passed := u.proto(plan.Step)
		storeDown := passed.StoreDidNotServe()
		recoveryWaits := storeDown && fellBack != nil
		c.passOver(job, plan.Step, u, storeDown, step < 0 && try+1 < maxFallback && !recoveryWaits)
		found = append(found, passed)
		if storeDown {
			unsure = append(unsure, passed)
		}
		if recoveryWaits { // the event says why, for the retry too (waitsForStore)
			plan.Skipped = append(plan.Skipped, passed)
		}
		if step >= 0 || recoveryWaits {
			return plan, "", nil
		}
		if try+1 >= maxFallback {
			return nil, "", fmt.Errorf("%w: coordinator: restore of job %s gave up after %d steps that could not be restored: %s", ErrNotFound, job, len(found), skippedText(found))
		}
		below, plan = plan.Step, nil
	}
}

// waitsForStore reports whether plan's restore failed only because a
// store did not serve copies of its step (the step is not marked).
func waitsForStore(plan *coordpb.PlanRestoreResponse) bool {
	if plan == nil || plan.Ok {
		return false
	}
	i := slices.IndexFunc(plan.Skipped, func(u *coordpb.UnrestorableStep) bool { return u.Step == plan.Step })
	return i >= 0 && plan.Skipped[i].StoreDidNotServe()
}

// passOver records that a restore could not bring job's step back whole,
// and why: the step is marked unrestorable, unless only a store's outage
// kept some rank's copies from serving (storeDown); then it is left as
// it is, for a later restore to try again.
func (c *Coordinator) passOver(job string, step int64, u *Unrestorable, storeDown, fallback bool) {
	if storeDown {
		c.log.Warn("step not restored: a store holding copies of it did not serve them; it is not marked, a later restore tries it again",
			"job", job, "step", step, "why", u.String(), "fallback", fallback)
		return
	}
	if _, err := c.apply(func(ch *Changes) error { return c.state.MarkUnrestorable(job, step, u, ch) }); err != nil {
		c.log.Error("recording a step as unrestorable", "job", job, "step", step, "err", err)
	}
	c.log.Warn("step cannot be restored whole: nothing switched to it", "job", job, "step", step, "why", u.String(), "fallback", fallback)
}

// targets returns the node each rank of plan is restored on.
func targets(plan *coordpb.PlanRestoreResponse) map[uint32]string {
	out := make(map[uint32]string, len(plan.Ranks))
	for _, rp := range plan.Ranks {
		out[rp.Rank] = rp.TargetNode
	}
	return out
}

// newStage returns a restore's stage, unique enough to never meet another.
func newStage() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// stageAll has the agent of each rank's node stage the rank's shard of
// plan's step (FetchRequest.stage), many ranks at once. It fills in, per
// rank, what served and what failed, sets plan.Ok when every rank is
// staged, and returns, by rank, the failed attempts of every rank whose
// agent answered.
func (c *Coordinator) stageAll(ctx context.Context, plan *coordpb.PlanRestoreResponse, stage string) map[uint32][]*agentpb.FetchAttempt {
	c.mu.Lock()
	addrs := c.agentAddrsLocked()
	c.mu.Unlock()
	var wg sync.WaitGroup
	var mu sync.Mutex
	attempts := map[uint32][]*agentpb.FetchAttempt{}
	sem := make(chan struct{}, maxRestoreCalls)
	for _, rp := range plan.Ranks {
		rp.Used, rp.Failed, rp.Bytes, rp.Error = "", nil, 0, ""
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if failed, answered := c.stageRank(ctx, plan, rp, addrs, stage); answered {
				mu.Lock()
				attempts[rp.Rank] = failed
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	plan.Ok = true
	for _, rp := range plan.Ranks {
		plan.Ok = plan.Ok && rp.Error == ""
	}
	return attempts
}

// stageRank has rank rp's node stage its shard; answered says the agent
// answered the fetch (served, or tried every source).
func (c *Coordinator) stageRank(ctx context.Context, plan *coordpb.PlanRestoreResponse, rp *coordpb.RankPlan, addrs map[string]string, stage string) (failed []*agentpb.FetchAttempt, answered bool) {
	start := time.Now()
	defer func() { rp.Nanos = time.Since(start).Nanoseconds() }()
	if rp.TargetNode == "" || len(rp.Sources) == 0 {
		rp.Error = fmt.Sprintf("rank %d has no node to run on or no copy", rp.Rank)
		return nil, false
	}
	if err := ctx.Err(); err != nil { // the request is over: start no more fetches
		rp.Error = fmt.Sprintf("rank %d not restored: %v", rp.Rank, err)
		return nil, false
	}
	req := &agentpb.FetchRequest{Job: plan.Job, Rank: rp.Rank, Step: plan.Step, WorldSize: uint32(len(plan.Ranks)),
		SizeBytes: rp.Sources[0].SizeBytes, HeaderChecksum: rp.Sources[0].HeaderChecksum, Stage: stage}
	for _, s := range rp.Sources {
		req.Sources = append(req.Sources, &agentpb.FetchSource{Tier: s.Tier, Node: s.Node, Addr: addrs[s.Node]})
	}
	err := c.agentCall(ctx, rp.TargetNode, func(ctx context.Context, a agentpb.AgentClient) error {
		resp, err := a.Fetch(ctx, req)
		if err != nil {
			return err
		}
		rp.Used, rp.Bytes, failed, answered = resp.Tier, resp.SizeBytes, resp.Failed, true
		for _, f := range resp.Failed {
			rp.Failed = append(rp.Failed, f.Tier+": "+f.Error)
		}
		return nil
	})
	switch {
	case err != nil:
		rp.Error = err.Error()
	case rp.Used == "":
		rp.Error = fmt.Sprintf("no source could restore job %s rank %d step %d (%d tried)", plan.Job, rp.Rank, plan.Step, len(failed))
	}
	return failed, answered
}

// finishStage ends a restore's staging on every node a rank of plan runs
// on: commit switches every staged rank to the step at once; otherwise
// the staged slots are freed. The error names each node that failed.
func (c *Coordinator) finishStage(ctx context.Context, plan *coordpb.PlanRestoreResponse, stage string, commit bool) error {
	failed := c.finishOn(ctx, plan, stage, commit)
	var errs []error
	for _, n := range slices.Sorted(maps.Keys(failed)) {
		errs = append(errs, fmt.Errorf("node %s: %w", n, failed[n]))
	}
	return errors.Join(errs...)
}

// finishOn is finishStage, returning the nodes that failed and why.
func (c *Coordinator) finishOn(ctx context.Context, plan *coordpb.PlanRestoreResponse, stage string, commit bool) map[string]error {
	nodes := map[string]bool{}
	for _, rp := range plan.Ranks {
		if rp.TargetNode != "" {
			nodes[rp.TargetNode] = true
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := map[string]error{}
	sem := make(chan struct{}, maxRestoreCalls)
	for _, n := range slices.Sorted(maps.Keys(nodes)) {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			err := c.agentCall(ctx, n, func(ctx context.Context, a agentpb.AgentClient) error {
				_, err := a.FinishRestore(ctx, &agentpb.FinishRestoreRequest{Job: plan.Job, Stage: stage, Commit: commit})
				return err
			})
			if err != nil {
				mu.Lock()
				failed[n] = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// markCorrupt marks the tier copies a failed restore found corrupt: they
// leave restore plans and show as corrupt. A corrupt copy in a node's
// memory is its agent's to mark (it verifies its own when a peer refuses
// what it sent).
func (c *Coordinator) markCorrupt(plan *coordpb.PlanRestoreResponse, attempts map[uint32][]*agentpb.FetchAttempt) {
	for rank, as := range attempts {
		for _, a := range as {
			tier, _, _ := strings.Cut(a.Tier, ":")
			if a.Failure != agentpb.FetchFailure_FETCH_FAILURE_CORRUPT || tier == "shm" || !tiers.Name(tier).Valid() {
				continue
			}
			c.tiers.markCorrupt(plan.Job, plan.Step, rank, tier, a.Error)
		}
	}
}

// unrestorableFrom says why plan's step could not be restored whole, from
// its ranks that failed: nil when one failed for a reason that is not the
// step's (its agent did not answer, or had no room for the shard).
func unrestorableFrom(plan *coordpb.PlanRestoreResponse, attempts map[uint32][]*agentpb.FetchAttempt, now time.Time) *Unrestorable {
	u := &Unrestorable{At: now}
	for _, rp := range plan.Ranks {
		if rp.Error == "" {
			continue
		}
		as, answered := attempts[rp.Rank]
		if !answered {
			return nil
		}
		rf := RankFailure{Rank: rp.Rank}
		for _, a := range as {
			if a.Failure == agentpb.FetchFailure_FETCH_FAILURE_NO_ROOM {
				return nil
			}
			rf.Copies = append(rf.Copies, CopyFailure{Copy: a.Tier, Error: strings.Join(strings.Fields(a.Error), " "),
				Corrupt:     a.Failure == agentpb.FetchFailure_FETCH_FAILURE_CORRUPT,
				Unreachable: a.Failure == agentpb.FetchFailure_FETCH_FAILURE_UNREACHABLE})
		}
		u.Ranks = append(u.Ranks, rf)
	}
	if len(u.Ranks) == 0 {
		return nil
	}
	return u
}
