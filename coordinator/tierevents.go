package coordinator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/tiers"
)

// tierKinds are the orders of tier copies.
var tierKinds = []coordpb.OrderKind{coordpb.OrderKind_ORDER_KIND_PUSH, coordpb.OrderKind_ORDER_KIND_MANIFEST, coordpb.OrderKind_ORDER_KIND_DELETE}

// outcome applies one transfer outcome reported by node. The order is
// claimed under t.mu, so that an order is pending until its outcome is
// applied.
func (t *tiering) outcome(node string, ev *coordpb.TierEvent) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || !slices.Contains(tierKinds, ev.Kind) {
		return
	}
	if od := t.c.streams.claim(node, ev); od != nil {
		t.handle(node, od, ev)
	} // else an order of an earlier run, or a duplicate report
}

// lost fails the tier orders node's stream s was sent and never reported.
func (t *tiering) lost(node string, s *subscriber, why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	for _, od := range t.c.streams.claimLost(node, s, tierKinds...) {
		t.handle(node, od, lostEvent(od, why))
	}
}

// handle applies the outcome of od, a tier order. The caller holds t.mu.
func (t *tiering) handle(node string, od *order, ev *coordpb.TierEvent) {
	o := od.o
	kind, tier := o.Kind(), o.TierName()
	tc := t.copies[tierKey{o.Job, o.Step, tier}]
	if tc == nil {
		return
	}
	t.m.transfers.WithLabelValues(tier, kind.Label(), okResult(ev.Ok)).Inc()
	t.m.bytes.WithLabelValues(tier).Add(float64(ev.Bytes))
	switch kind {
	case coordpb.OrderKind_ORDER_KIND_PUSH:
		t.pushed(tc, o.RankOf(), ev)
	case coordpb.OrderKind_ORDER_KIND_MANIFEST:
		t.manifested(tc, node, ev)
	case coordpb.OrderKind_ORDER_KIND_DELETE:
		t.deleted(tc, node, ev)
	}
}

func (t *tiering) pushed(tc *tierCopy, rank uint32, ev *coordpb.TierEvent) {
	if tc.State != tcCopying {
		return
	}
	if ev.Ok {
		tc.Done[rank] = ev.Bytes
	} else {
		tc.Failed[rank] = ev.Error
	}
	if len(tc.Done)+len(tc.Failed) < len(tc.Holders) {
		t.persist(tc)
		return
	}
	if len(tc.Failed) > 0 {
		r := slices.Min(slices.Collect(maps.Keys(tc.Failed)))
		t.fail(tc, fmt.Sprintf("push of rank %d: %s", r, tc.Failed[r]))
		return
	}
	// Every shard is on the tier: the manifests make the copy exist.
	for node, ranks := range t.manifestNodes(tc) {
		tc.Manifests[node] = false
		t.send(node, &coordpb.TransferOrder{Job: tc.Job, Step: tc.Step, Order: &coordpb.TransferOrder_Manifest{Manifest: &coordpb.ManifestOrder{
			Tier: tc.Tier, WorldSize: tc.WorldSize, Ranks: ranks, Shards: tc.shardsProto()}}})
	}
	t.persist(tc)
}

// manifestNodes returns who writes a copy's manifests, with the ranks each
// names: every holder on a node-local tier, one node on a shared one.
func (t *tiering) manifestNodes(tc *tierCopy) map[string][]uint32 {
	if tiers.Name(tc.Tier).NodeLocal() {
		return tc.nodesOf()
	}
	all := make([]uint32, tc.WorldSize)
	for i := range all {
		all[i] = uint32(i)
	}
	return map[string][]uint32{t.sharedWriter(tc): all}
}

// sharedWriter picks the node that writes a shared tier's manifest or runs
// its deletion: the holder of rank 0 if it is connected, else any
// connected node with the tier.
func (t *tiering) sharedWriter(tc *tierCopy) string {
	if n := tc.Holders[0]; t.c.streams.has(n, tc.Tier) {
		return n
	}
	if n := t.c.streams.withTier(tc.Tier); n != "" {
		return n
	}
	return tc.Holders[0] // waits for it to connect
}

func (t *tiering) manifested(tc *tierCopy, node string, ev *coordpb.TierEvent) {
	if tc.State != tcCopying {
		return
	}
	if !ev.Ok {
		t.fail(tc, "manifest on "+node+": "+ev.Error)
		return
	}
	tc.Manifests[node] = true
	for _, ok := range tc.Manifests {
		if !ok {
			t.persist(tc)
			return
		}
	}
	if err := t.c.cfg.Faults.Check(context.Background(), faultinject.CoordBeforeTierRecord); err != nil {
		t.fail(tc, "recording the copy: "+err.Error())
		return
	}
	tc.State, tc.Finished = tcDurable, t.c.cfg.Clock.Now()
	t.persist(tc)
	if err := t.index(tc, CopyCommitted); err != nil {
		t.c.log.Error("recording tier copies in the index", "copy", tc.String(), "err", err)
	}
	t.c.log.Info("step durable on tier", "job", tc.Job, "step", tc.Step, "tier", tc.Tier,
		"seconds", tc.Finished.Sub(tc.Started).Seconds())
	t.prune(tc)
	t.retain(tc.Job, tc.Tier)
}

// fail ends a copy that cannot complete and removes what it wrote.
func (t *tiering) fail(tc *tierCopy, why string) {
	tc.State, tc.Error, tc.Finished = tcFailed, why, t.c.cfg.Clock.Now()
	t.persist(tc)
	t.c.log.Warn("tier copy failed; a later step will be copied", "copy", tc.String(), "err", why)
	t.sendDeletes(tc)
}

// sendDeletes orders the removal of a copy's manifests and shards.
func (t *tiering) sendDeletes(tc *tierCopy) {
	nodes := tc.nodesOf()
	if !tiers.Name(tc.Tier).NodeLocal() {
		nodes = t.manifestNodes(tc)
	}
	for node, ranks := range nodes {
		if tc.Deletes[node] {
			continue
		}
		tc.Deletes[node] = false
		t.send(node, &coordpb.TransferOrder{Job: tc.Job, Step: tc.Step, Order: &coordpb.TransferOrder_Delete{Delete: &coordpb.DeleteOrder{
			Tier: tc.Tier, WorldSize: tc.WorldSize, Ranks: ranks}}})
	}
	t.persist(tc)
}

func (t *tiering) deleted(tc *tierCopy, node string, ev *coordpb.TierEvent) {
	if !ev.Ok {
		tc.Error = "deleting on " + node + ": " + ev.Error
		delete(tc.Deletes, node) // the next retention pass asks again
		t.persist(tc)
		return
	}
	tc.Deletes[node] = true
	for _, ok := range tc.Deletes {
		if !ok {
			t.persist(tc)
			return
		}
	}
	if tc.State == tcDeleting {
		t.forget(tc)
		if err := t.c.store.deleteTierCopy(tc); err != nil {
			t.c.log.Error("removing a tier copy's record", "copy", tc.String(), "err", err)
		}
		t.c.log.Info("tier copy removed by retention", "job", tc.Job, "step", tc.Step, "tier", tc.Tier)
		return
	}
	t.persist(tc)
}

// prune forgets failed copies older than a durable one of the same tier.
func (t *tiering) prune(durable *tierCopy) {
	for _, tc := range t.copies {
		if tc.Job == durable.Job && tc.Tier == durable.Tier && tc.State == tcFailed && tc.Step < durable.Step &&
			t.pendingOrders(tc) == 0 {
			t.forget(tc)
			_ = t.c.store.deleteTierCopy(tc)
		}
	}
}

// pendingOrders counts the orders of a copy not yet reported.
func (t *tiering) pendingOrders(tc *tierCopy) int {
	return t.c.streams.count(func(_ string, o *coordpb.TransferOrder, _ bool) bool {
		return o.Job == tc.Job && o.Step == tc.Step && o.TierName() == tc.Tier
	})
}

// retain removes the tier's copies of job that the policy no longer keeps:
// never the latest consistent step, never the tier's newest copy. A copy
// with a shard found corrupt is not counted among those kept, and goes
// unless its step is the latest consistent one; a copy rediscovered in
// part is not counted until it is whole, and goes once it is older than
// every whole copy kept.
func (t *tiering) retain(job, tier string) {
	keep := -1
	for _, tp := range t.policy(job).Tiers {
		if string(tp.Tier) == tier {
			keep = tp.Keep
		}
	}
	var durable []int64
	var deleting, corrupt, partial []*tierCopy
	for _, tc := range t.copies {
		if tc.Job != job || tc.Tier != tier {
			continue
		}
		switch {
		case tc.partial(): // not counted until every rank's shard is found
			partial = append(partial, tc)
		case tc.State == tcDurable && len(tc.Corrupt) > 0: // not kept, not counted as kept
			corrupt = append(corrupt, tc)
		case tc.State == tcDurable:
			durable = append(durable, tc.Step)
		case tc.State == tcDeleting:
			deleting = append(deleting, tc)
		}
	}
	slices.Sort(durable)
	if keep < 0 {
		keep = len(durable) // the tier left the policy: keep what it has
	}
	t.c.mu.Lock()
	latest := int64(-1)
	if j := t.c.state.Jobs[job]; j != nil {
		latest = j.Latest
	}
	t.c.mu.Unlock()
	var drop []*tierCopy
	gone := tiers.Retain(durable, keep, latest)
	for _, step := range gone {
		drop = append(drop, t.copies[tierKey{job, step, tier}])
	}
	// A copy found in part (its other nodes never listed) goes once the
	// policy's count of whole copies newer than it is kept.
	if kept := slices.DeleteFunc(durable, func(s int64) bool { return slices.Contains(gone, s) }); len(kept) >= keep && len(kept) > 0 {
		for _, tc := range partial {
			if tc.Step < kept[0] && tc.Step != latest {
				drop = append(drop, tc)
			}
		}
	}
	for _, tc := range corrupt {
		if tc.Step != latest { // its good shards may be what keeps the latest step restorable
			drop = append(drop, tc)
		}
	}
	for _, tc := range drop {
		tc.State, tc.Error = tcDeleting, ""
		// Out of the index first: from now on no restore plans on it.
		if err := t.index(tc, CopyDeleted); err != nil {
			t.c.log.Error("removing tier copies from the index", "copy", tc.String(), "err", err)
		}
		t.sendDeletes(tc)
	}
	for _, tc := range deleting { // deletions that failed earlier
		if t.pendingOrders(tc) == 0 {
			t.sendDeletes(tc)
		}
	}
}

// index records a copy's shards in the index as restore sources
// (CopyCommitted; not a shard found corrupt), or removes them
// (CopyDeleted).
func (t *tiering) index(tc *tierCopy, state CopyState) error {
	_, err := t.c.apply(func(ch *Changes) error {
		var errs []error
		for _, s := range tc.Shards {
			if tc.copyNode(s.Rank) == "" {
				continue // a rediscovered node-local copy whose other nodes have not been listed
			}
			if state == CopyCommitted && tc.Corrupt[s.Rank] != "" {
				continue // it stays among the step's bad copies
			}
			rec := Record{Job: tc.Job, Step: tc.Step, Rank: s.Rank, WorldSize: tc.WorldSize, Node: tc.copyNode(s.Rank),
				Tier: tc.Tier, Size: uint64(s.Size), Sum: s.HeaderChecksum, State: state}
			if err := t.c.state.Apply(rec, ch); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return errs[0]
		}
		return nil
	})
	return err
}

// reader picks the node that reads a tier copy back: its own node on a
// node-local tier, any connected node with the tier on a shared one. With
// none connected (agents reconnecting after a coordinator restart), it
// waits up to readerWait, then says so.
func (t *tiering) reader(ctx context.Context, tier, node string) (string, error) {
	return t.readerBut(ctx, tier, node, "")
}

// readerBut is reader passing over node but on a shared tier, and over
// the nodes declared down (not called until they come back).
func (t *tiering) readerBut(ctx context.Context, tier, node, but string) (string, error) {
	if node != sharedNode {
		return node, nil
	}
	deadline := time.Now().Add(readerWait)
	for {
		down := t.c.downNodes()
		if n := t.c.streams.withTierBut(tier, func(n string) bool { return n == but || down[n] }); n != "" {
			return n, nil
		}
		if time.Now().After(deadline) {
			who := "no connected agent"
			if but != "" {
				who += " but node " + but
			}
			return "", fmt.Errorf("coordinator: %s has tier %s to read the copy back (agents reconnect within seconds of a coordinator restart: try again)", who, tier)
		}
		if err := clock.Sleep(ctx, 100*time.Millisecond); err != nil {
			return "", err
		}
	}
}

// readerWait bounds reader's wait for an agent with the tier.
const readerWait = 10 * time.Second

// deleteStep removes every tier copy of a step (an operator's delete) and
// returns how many shard copies it removes.
func (t *tiering) deleteStep(job string, step int64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stepDeleted(job, step)
	n := 0
	for _, tier := range tiers.Names() {
		tc := t.copies[tierKey{job, step, string(tier)}]
		if tc == nil || tc.State == tcDeleting {
			continue
		}
		if tc.State == tcDurable {
			if err := t.index(tc, CopyDeleted); err != nil {
				t.c.log.Error("removing tier copies from the index", "copy", tc.String(), "err", err)
			}
			n += len(tc.Shards)
		}
		tc.State, tc.Error = tcDeleting, ""
		t.sendDeletes(tc)
	}
	return n
}

func okResult(ok bool) string {
	if ok {
		return "ok"
	}
	return "failed"
}
