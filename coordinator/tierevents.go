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

// handle applies one transfer outcome reported by node.
func (t *tierer) handle(node string, ev *coordpb.TierEvent) {
	if t.closed {
		return
	}
	od := t.orders[ev.Order]
	if od == nil || od.node != node || od.o.Kind != ev.Kind {
		return // an order of an earlier run, or a duplicate report
	}
	delete(t.orders, ev.Order)
	o := od.o
	if o.Kind == "replicate" {
		t.m.transfers.WithLabelValues("shm", o.Kind, okResult(ev.Ok)).Inc()
		t.m.bytes.WithLabelValues("shm").Add(float64(ev.Bytes))
		if !t.commitReplicaDone(ev.Order, ev) {
			t.replicaDone(o.Job, ev.Order, ev)
		}
		return
	}
	tc := t.copies[tierKey{o.Job, o.Step, o.Tier}]
	if tc == nil {
		return
	}
	t.m.transfers.WithLabelValues(o.Tier, o.Kind, okResult(ev.Ok)).Inc()
	t.m.bytes.WithLabelValues(o.Tier).Add(float64(ev.Bytes))
	switch o.Kind {
	case "push":
		t.pushed(tc, o.Rank, ev)
	case "manifest":
		t.manifested(tc, node, ev)
	case "delete":
		t.deleted(tc, node, ev)
	}
}

func (t *tierer) pushed(tc *tierCopy, rank uint32, ev *coordpb.TierEvent) {
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
		t.send(node, &coordpb.TransferOrder{Kind: "manifest", Job: tc.Job, Step: tc.Step, Tier: tc.Tier,
			WorldSize: tc.WorldSize, Ranks: ranks, Shards: tc.shardsProto()})
	}
	t.persist(tc)
}

// manifestNodes returns who writes a copy's manifests, with the ranks each
// names: every holder on a node-local tier, one node on a shared one.
func (t *tierer) manifestNodes(tc *tierCopy) map[string][]uint32 {
	if tiers.TierNodeLocal(tc.Tier) {
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
func (t *tierer) sharedWriter(tc *tierCopy) string {
	if n := tc.Holders[0]; t.subs[n] != nil && slices.Contains(t.subs[n].tiers, tc.Tier) {
		return n
	}
	for _, n := range slices.Sorted(maps.Keys(t.subs)) {
		if slices.Contains(t.subs[n].tiers, tc.Tier) {
			return n
		}
	}
	return tc.Holders[0] // waits for it to connect
}

func (t *tierer) manifested(tc *tierCopy, node string, ev *coordpb.TierEvent) {
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
	if err := t.index(tc, "committed"); err != nil {
		t.c.log.Error("recording tier copies in the index", "copy", tc.String(), "err", err)
	}
	t.c.log.Info("step durable on tier", "job", tc.Job, "step", tc.Step, "tier", tc.Tier,
		"seconds", tc.Finished.Sub(tc.Started).Seconds())
	t.prune(tc)
	t.retain(tc.Job, tc.Tier)
}

// fail ends a copy that cannot complete and removes what it wrote.
func (t *tierer) fail(tc *tierCopy, why string) {
	tc.State, tc.Error, tc.Finished = tcFailed, why, t.c.cfg.Clock.Now()
	t.persist(tc)
	t.c.log.Warn("tier copy failed; a later step will be copied", "copy", tc.String(), "err", why)
	t.sendDeletes(tc)
}

// sendDeletes orders the removal of a copy's manifests and shards.
func (t *tierer) sendDeletes(tc *tierCopy) {
	nodes := tc.nodesOf()
	if !tiers.TierNodeLocal(tc.Tier) {
		nodes = t.manifestNodes(tc)
	}
	for node, ranks := range nodes {
		if tc.Deletes[node] {
			continue
		}
		tc.Deletes[node] = false
		t.send(node, &coordpb.TransferOrder{Kind: "delete", Job: tc.Job, Step: tc.Step, Tier: tc.Tier,
			WorldSize: tc.WorldSize, Ranks: ranks})
	}
	t.persist(tc)
}

func (t *tierer) deleted(tc *tierCopy, node string, ev *coordpb.TierEvent) {
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
func (t *tierer) prune(durable *tierCopy) {
	for _, tc := range t.copies {
		if tc.Job == durable.Job && tc.Tier == durable.Tier && tc.State == tcFailed && tc.Step < durable.Step &&
			len(t.pendingOrders(tc)) == 0 {
			t.forget(tc)
			_ = t.c.store.deleteTierCopy(tc)
		}
	}
}

// pendingOrders lists the orders of a copy not yet reported.
func (t *tierer) pendingOrders(tc *tierCopy) []*order {
	var out []*order
	for _, od := range t.orders {
		if od.o.Job == tc.Job && od.o.Step == tc.Step && od.o.Tier == tc.Tier {
			out = append(out, od)
		}
	}
	return out
}

// retain removes the tier's copies of job that the policy no longer keeps:
// never the latest consistent step, never the tier's newest copy.
func (t *tierer) retain(job, tier string) {
	keep := -1
	for _, tp := range t.policy(job).Tiers {
		if tp.Tier == tier {
			keep = tp.Keep
		}
	}
	var durable []int64
	var deleting []*tierCopy
	for _, tc := range t.copies {
		if tc.Job != job || tc.Tier != tier {
			continue
		}
		switch tc.State {
		case tcDurable:
			durable = append(durable, tc.Step)
		case tcDeleting:
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
	for _, step := range tiers.Retain(durable, keep, latest) {
		tc := t.copies[tierKey{job, step, tier}]
		tc.State, tc.Error = tcDeleting, ""
		// Out of the index first: from now on no restore plans on it.
		if err := t.index(tc, "deleted"); err != nil {
			t.c.log.Error("removing tier copies from the index", "copy", tc.String(), "err", err)
		}
		t.sendDeletes(tc)
	}
	for _, tc := range deleting { // deletions that failed earlier
		if len(t.pendingOrders(tc)) == 0 {
			t.sendDeletes(tc)
		}
	}
}

// index records a copy's shards in the index as restore sources
// ("committed"), or removes them ("deleted").
func (t *tierer) index(tc *tierCopy, state string) error {
	_, err := t.c.apply(func(ch *Changes) error {
		var errs []error
		for _, s := range tc.Shards {
			if tc.copyNode(s.Rank) == "" {
				continue // a rediscovered node-local copy whose other nodes have not been listed
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
func (t *tierer) reader(ctx context.Context, tier, node string) (string, error) {
	if node != sharedNode {
		return node, nil
	}
	deadline := time.Now().Add(readerWait)
	for {
		if n := t.connectedWith(tier); n != "" {
			return n, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("coordinator: no connected agent has tier %s to read the copy back (agents reconnect within seconds of a coordinator restart: try again)", tier)
		}
		if err := clock.Sleep(ctx, 100*time.Millisecond); err != nil {
			return "", err
		}
	}
}

// readerWait bounds reader's wait for an agent with the tier.
const readerWait = 10 * time.Second

// connectedWith returns a connected node with tier, "" if none.
func (t *tierer) connectedWith(tier string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range slices.Sorted(maps.Keys(t.subs)) {
		if slices.Contains(t.subs[n].tiers, tier) {
			return n
		}
	}
	return ""
}

// deleteStep removes every tier copy of a step (an operator's delete) and
// returns how many shard copies it removes.
func (t *tierer) deleteStep(job string, step int64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stepDeleted(job, step)
	n := 0
	for _, tier := range []string{"nvme", "pfs", "s3"} {
		tc := t.copies[tierKey{job, step, tier}]
		if tc == nil || tc.State == tcDeleting {
			continue
		}
		if tc.State == tcDurable {
			if err := t.index(tc, "deleted"); err != nil {
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
