package coordinator

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/tiers"
)

// A tier copy recorded durable can go missing afterwards: its objects
// deleted by hand or by a lifecycle rule, the bucket wiped (an object
// store restarted on an empty data directory), a node's NVMe replaced
// with the node. Nothing scrubs the tiers; the coordinator learns it when
// a read finds the copy gone: rewind verify (VerifyStep), or a restore's
// fetch that could not read a tier copy (it went on to the next source).
//
// A shard whose read answered "not found" (agent VerifyTier: the manifest
// or the shard is not on the store, or the bucket is gone) is marked
// missing (tiercorrupt.go, a reason beginning with missingPrefix): it
// leaves restore plans, the copy shows as corrupt naming the missing
// shard, retention no longer counts it among the copies it keeps, and
// removes it at its next pass (unless its step is the job's latest). On a
// shared tier a second connected agent with the tier, when there is one,
// must not find it either: one agent's store set up wrong (another
// bucket, another prefix) must not take good copies away, nor have
// retention delete them. A read that did not answer (the store down or
// unreachable, the agent gone) marks nothing; a verify that later finds
// the shard whole puts it back.

// missingFrom reports whether err is an agent's answer that its tier does
// not hold the copy.
func missingFrom(err error) bool { return status.Code(err) == codes.NotFound }

// noteMissing acts on reader's verify of rank's shard of job's step on
// tier (recorded on node: sharedNode on a shared tier) that answered err:
// if the tier does not hold the shard, and, on a shared tier, another
// agent with it does not find it either, the shard is marked missing.
func (c *Coordinator) noteMissing(ctx context.Context, job string, step int64, rank uint32, tier, node, reader string, err error) {
	if !missingFrom(err) || !c.leading() {
		return
	}
	why := fmt.Sprintf("%s (read by node %s)", oneLine(status.Convert(err).Message()), reader)
	if node == sharedNode {
		down := c.downNodes()
		if other := c.streams.withTierBut(tier, func(n string) bool { return n == reader || down[n] }); other != "" {
			ok, problem, err := c.verifyShard(ctx, other, job, step, rank, tier)
			switch {
			case err == nil && !ok:
				c.tiers.markCorrupt(job, step, rank, tier, fmt.Sprintf("%s (verified by node %s)", problem, other))
				return
			case !missingFrom(err):
				c.log.Warn("a tier copy one node found missing another could read, or did not answer: not marked", "job", job, "step", step,
					"rank", rank, "tier", tier, "missing_on", reader, "checked_on", other, "whole", err == nil && ok, "err", err)
				return
			}
			why += "; nor by node " + other
		}
	}
	c.tiers.markCorrupt(job, step, rank, tier, missingPrefix+why)
}

// checkUnread checks, in the background, the durable tier copies that a
// restore's fetches of job's step could not read (attempts by rank; a
// corrupt copy is marked already, a copy in memory is its agent's): one
// the tier no longer holds is marked missing (noteMissing). The checks
// share the bounds of the checks of reported copies (tiersuspect.go),
// each counted against the node that fetched; one not taken now is made
// by a later restore or verify. fetcher gives each rank's fetching node.
func (c *Coordinator) checkUnread(job string, step int64, attempts map[uint32][]*agentpb.FetchAttempt, fetcher map[uint32]string) {
	for rank, as := range attempts {
		for _, a := range as {
			tier, node, _ := strings.Cut(a.Tier, ":")
			if a.Failure != agentpb.FetchFailure_FETCH_FAILURE_UNAVAILABLE || !tiers.Name(tier).Valid() {
				continue
			}
			k := suspectKey{job, step, rank, tier}
			at, _ := c.tiers.suspectable(k, node, "")
			if at == "" { // no durable copy of it, or marked already
				continue
			}
			if _, start := c.suspects.begin(k, fetcher[rank], c.cfg.Clock.Now()); !start {
				continue
			}
			c.mu.Lock()
			if c.closing {
				c.mu.Unlock()
				c.suspects.end(k, false, c.cfg.Clock.Now())
				return
			}
			c.bg.Add(1)
			c.mu.Unlock()
			go func() {
				defer c.bg.Done()
				c.suspects.end(k, c.checkRead(c.bgCtx, k, at), c.cfg.Clock.Now())
			}()
		}
	}
}

// checkRead has an agent with the tier verify the shard k of a copy
// recorded on node, and marks it missing or corrupt as it finds it. It
// reports whether the shard verified whole.
func (c *Coordinator) checkRead(ctx context.Context, k suspectKey, node string) bool {
	select {
	case c.suspects.sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	defer func() { <-c.suspects.sem }()
	reader, err := c.tiers.reader(ctx, k.tier, node)
	if err != nil {
		return false
	}
	ok, problem, err := c.verifyShard(ctx, reader, k.job, k.step, k.rank, k.tier)
	switch {
	case err != nil:
		c.noteMissing(ctx, k.job, k.step, k.rank, k.tier, node, reader, err)
	case !ok && c.leading():
		c.tiers.markCorrupt(k.job, k.step, k.rank, k.tier, fmt.Sprintf("%s (verified by node %s)", problem, reader))
	}
	return err == nil && ok
}
