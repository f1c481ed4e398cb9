package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/tiers"
	"rewind.dev/rewind/transport"
)

// Rediscovery: the store is an index, not the only truth. Every durable
// tier copy has its manifest on its tier, so a coordinator started on an
// empty or lost store (an emptyDir, a lost disk, a failover) asks the
// agents what their tiers hold and rebuilds the copies it does not know:
//
//   - each node's NVMe, from that node's agent, once per coordinator life;
//   - each shared tier (pfs, s3: one store every node reaches), once per
//     coordinator life, from one agent that has it.
//
// A manifest of a copy the index does not know becomes a durable tier
// copy (marked rediscovered), persisted and indexed as one made here: its
// step, and its job when the index lacks them, are created with the
// manifest's world size (only consistent steps are ever tiered). A copy
// the index knows is left alone. A deleted copy does not come back: its
// manifest is deleted before its shards (transfer.go), so a listing does
// not see it once the deletion has begun; one listed before and merged
// after its deletion ended is recognised by the tombstones kept while
// listings are in flight, and one of a step an operator deleted is
// deleted again. Retention counts rediscovered copies at the job's next
// durable copy on the tier, like any other; it does not run on a listing
// itself, when the job's own policy may not be known yet (it is stored
// with the index, and registered again by the job).

// Listing bounds and pacing.
const (
	// rediscoverEvery is how often the coordinator looks for a tier no
	// agent has listed yet (a subscription also wakes it).
	rediscoverEvery = time.Second
	// listTimeout bounds one agent's listing: 65,536 manifests read eight
	// at a time from an object store take about a minute.
	listTimeout = 10 * time.Minute
	// maxListings bounds the agents listing at once.
	maxListings = 8
	// listRetryFirst and listRetryMax pace the retries of a tier whose
	// listing failed.
	listRetryFirst, listRetryMax = 5 * time.Second, 5 * time.Minute
	// maxListPage bounds one page received: a manifest goes alone in its
	// page when large (a million ranks is about 30 MB in protobuf).
	maxListPage = 256 << 20
)

// rediscovery is the listings' bookkeeping. Every field but wake is
// guarded by tiering.mu.
type rediscovery struct {
	wake chan struct{}

	done     map[string]bool      // listing key -> listed in this coordinator life
	busy     map[string]bool      // listing key -> being listed
	busyNode map[string]bool      // node -> a listing of its tiers runs
	retryAt  map[string]time.Time // listing key -> not asked again before
	failures map[string]int       // listing key -> failed listings in a row
	running  int                  // listings in flight
	gone     map[tierKey]bool     // copies forgotten while a listing was in flight
	deleted  map[StepKey]bool     // steps an operator deleted in this life
}

func newRediscovery() *rediscovery {
	return &rediscovery{wake: make(chan struct{}, 1), done: map[string]bool{}, busy: map[string]bool{}, busyNode: map[string]bool{},
		retryAt: map[string]time.Time{}, failures: map[string]int{}, gone: map[tierKey]bool{}, deleted: map[StepKey]bool{}}
}

func (rd *rediscovery) poke() {
	select {
	case rd.wake <- struct{}{}:
	default:
	}
}

// listingKey names what one listing covers: a node's own node-local tier,
// or a shared tier.
func listingKey(tier, node string) string {
	if tiers.Name(tier).NodeLocal() {
		return tier + "@" + node
	}
	return tier
}

func newRediscoveredCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rewind_coordinator_tier_copies_rediscovered_total",
		Help: "Manifests found on the tiers that the index did not know, merged into it as durable tier copies (on a node-local tier, one per node's manifest), by tier.",
	}, []string{"tier"})
}

// forget removes a copy from tiering; while a listing is in flight it
// leaves a tombstone, so a manifest listed before the copy's deletion
// does not bring it back. The caller holds t.mu.
func (t *tiering) forget(tc *tierCopy) {
	delete(t.copies, tc.key())
	if t.rd.running > 0 {
		t.rd.gone[tc.key()] = true
	}
}

// stepDeleted records an operator's deletion of a step: a copy of it
// found on a tier later is deleted, not indexed. The caller holds t.mu.
func (t *tiering) stepDeleted(job string, step int64) {
	t.rd.deleted[StepKey{job, step}] = true
}

// listed reports whether a copy of job's step to tier may start as far as
// rediscovery goes: the shared tier, or the node-local tier of every node
// holding a shard, has been listed in this coordinator life (or its
// listing was tried and failed, which does not hold copies back for good),
// and no copy of the step found there is still being deleted. Until then
// no copy to the tier starts: its policy counts from the copies the tier
// holds, retention counts them, and a new copy does not share its name
// with one being deleted. The caller holds t.mu.
func (t *tiering) listed(job string, step int64, tier string, nodes []string) bool {
	if tc := t.copies[tierKey{job, step, tier}]; tc != nil && tc.State == tcDeleting {
		return false
	}
	settled := func(k string) bool { return t.rd.done[k] || t.rd.failures[k] > 0 }
	if !tiers.Name(tier).NodeLocal() {
		return settled(tier)
	}
	for _, node := range nodes {
		if !settled(listingKey(tier, node)) {
			return false
		}
	}
	return true
}

// rediscover starts the listings due until ctx ends.
func (t *tiering) rediscover(ctx context.Context) {
	tick := time.NewTicker(rediscoverEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-t.rd.wake:
		}
		for _, l := range t.listingsDue() {
			go t.list(ctx, l)
		}
	}
}

// listing is one agent's listing of some of its tiers.
type listing struct {
	node, addr string
	tiers      []string
}

// listingsDue picks the listings to start now and marks them busy: each
// connected node's node-local tier not yet listed, and each shared tier
// not yet listed from the first connected node that has it.
func (t *tiering) listingsDue() []listing {
	t.mu.Lock()
	defer t.mu.Unlock()
	rd := t.rd
	if t.closed {
		return nil
	}
	if !t.c.leading() {
		// A follower's index goes stale: it lists again when it leads.
		clear(rd.done)
		clear(rd.failures)
		clear(rd.retryAt)
		return nil
	}
	now := t.c.cfg.Clock.Now()
	var out []listing
	for _, node := range t.c.streams.nodes() {
		if rd.running+len(out) >= maxListings {
			break
		}
		if rd.busyNode[node] {
			continue
		}
		var names []string
		tierNames, _ := t.c.streams.tiersOf(node)
		for _, tier := range tierNames {
			k := listingKey(tier, node)
			if !rd.done[k] && !rd.busy[k] && !now.Before(rd.retryAt[k]) && !slices.Contains(names, tier) {
				names = append(names, tier)
			}
		}
		if len(names) == 0 {
			continue
		}
		t.c.mu.Lock()
		n := t.c.state.Nodes[node]
		t.c.mu.Unlock()
		if n == nil || n.Addr == "" {
			continue // not registered yet: its address comes with it
		}
		for _, tier := range names {
			rd.busy[listingKey(tier, node)] = true
		}
		rd.busyNode[node] = true
		out = append(out, listing{node: node, addr: n.Addr, tiers: names})
	}
	rd.running += len(out)
	return out
}

// listStats counts what became of one listing's manifests.
type listStats struct {
	listed, added, known, deleted, conflicts int
	failed                                   error // the index could not record what was found
}

// list runs one listing: it asks the agent for its tiers' manifests and
// merges them page by page, then records which tiers were listed whole.
func (t *tiering) list(ctx context.Context, l listing) {
	start := time.Now()
	var stats listStats
	results, err := t.fetchListing(ctx, l, func(page []*agentpb.TierManifest) {
		s := t.mergePage(l.node, page)
		stats.listed += s.listed
		stats.added += s.added
		stats.known += s.known
		stats.deleted += s.deleted
		stats.conflicts += s.conflicts
		if stats.failed == nil {
			stats.failed = s.failed
		}
	})
	if err == nil && stats.failed != nil {
		err = stats.failed
		clear(results) // asked again: what was not recorded is found again
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	rd := t.rd
	rd.running--
	if rd.running == 0 {
		clear(rd.gone)
	}
	delete(rd.busyNode, l.node)
	if ctx.Err() != nil { // shutting down
		for _, tier := range l.tiers {
			delete(rd.busy, listingKey(tier, l.node))
		}
		return
	}
	unimplemented := status.Code(err) == codes.Unimplemented
	now := t.c.cfg.Clock.Now()
	for _, tier := range l.tiers {
		k := listingKey(tier, l.node)
		delete(rd.busy, k)
		res := results[tier]
		switch {
		case unimplemented:
			// An agent of a version without TierCopies: nothing to learn
			// from it; another node may list a shared tier.
			if tiers.Name(tier).NodeLocal() {
				rd.done[k] = true
			} else {
				rd.failures[k]++ // settled: copies to the tier go on
				rd.retryAt[k] = now.Add(listRetryMax)
			}
		case res != nil && res.Error == "":
			rd.done[k], rd.failures[k] = true, 0
			if res.Truncated {
				t.c.log.Warn("tier listing reached its bound: the oldest copies on the tier are not in the index",
					"node", l.node, "tier", tier, "store", res.Store, "manifests", res.Manifests)
			}
		default:
			why := err
			if res != nil {
				why = errors.New(res.Error)
			} else if why == nil {
				why = errors.New("the agent's answer ended without the tier's listing")
			}
			rd.failures[k]++
			wait := min(listRetryFirst<<min(rd.failures[k]-1, 10), listRetryMax)
			rd.retryAt[k] = now.Add(wait)
			t.c.log.Warn("tier copies could not be listed whole; asking again later", "node", l.node, "tier", tier,
				"err", why, "retry_in", wait)
		}
	}
	if unimplemented {
		t.c.log.Warn("agent cannot list its tier copies (an older version); copies only it reaches are not rediscovered", "node", l.node)
		return
	}
	attrs := []any{"node", l.node, "tiers", l.tiers, "manifests", stats.listed, "added", stats.added, "known", stats.known,
		"deleted_again", stats.deleted, "conflicts", stats.conflicts, "seconds", time.Since(start).Seconds()}
	for _, tier := range l.tiers {
		if res := results[tier]; res != nil {
			attrs = append(attrs, tier+"_store", res.Store, tier+"_skipped_corrupt", res.Skipped)
		}
	}
	t.c.log.Info("tier copies listed", attrs...)
}

// fetchListing streams an agent's listing, handing each page of manifests
// to merge; it returns the tiers' outcomes from the last page.
func (t *tiering) fetchListing(ctx context.Context, l listing, merge func([]*agentpb.TierManifest)) (map[string]*agentpb.TierListing, error) {
	conn, err := t.c.cfg.Transport.NewClient(l.addr, transport.ExpectNode(l.node),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxListPage)))
	if err != nil {
		return nil, fmt.Errorf("coordinator: listing the tiers of node %s: %w", l.node, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	stream, err := agentpb.NewAgentClient(conn).TierCopies(ctx, &agentpb.TierCopiesRequest{Tiers: l.tiers})
	if err != nil {
		return nil, err
	}
	results := map[string]*agentpb.TierListing{}
	for {
		page, err := stream.Recv()
		if err == io.EOF {
			return results, nil
		}
		if err != nil {
			return results, err
		}
		if len(page.Manifests) > 0 {
			merge(page.Manifests)
		}
		for _, r := range page.Listings {
			results[r.Tier] = r
		}
	}
}

// manifestOf turns a listed manifest back into the tiers' form.
func manifestOf(pm *agentpb.TierManifest) *tiers.Manifest {
	m := &tiers.Manifest{Job: pm.Job, Step: pm.Step, WorldSize: pm.WorldSize, Here: pm.RanksHere, Shards: make([]tiers.ShardEntry, len(pm.Shards))}
	for i, s := range pm.Shards {
		m.Shards[i] = tiers.ShardEntry{Rank: s.Rank, Size: int64(s.SizeBytes), HeaderChecksum: s.HeaderChecksum}
	}
	if pm.WrittenUnixNano != 0 {
		m.WrittenAt = time.Unix(0, pm.WrittenUnixNano).UTC()
	}
	return m
}

// held lists the ranks whose shards a manifest's store holds.
func held(m *tiers.Manifest) []uint32 {
	if len(m.Here) > 0 {
		return m.Here
	}
	out := make([]uint32, m.WorldSize)
	for i := range out {
		out[i] = uint32(i)
	}
	return out
}
