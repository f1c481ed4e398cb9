package coordinator

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"testing"

	"rewind.dev/rewind/api/agentpb"
)

// listed is a manifest as an agent's TierCopies sends it: rank r's shard
// is 100+r bytes with checksum sum(r), unless sums overrides them.
func listed(tier, job string, step int64, ws uint32, here []uint32, sum func(r uint32) string) *agentpb.TierManifest {
	if sum == nil {
		sum = func(r uint32) string { return fmt.Sprintf("%016x", uint64(step)<<8|uint64(r)) }
	}
	pm := &agentpb.TierManifest{Tier: tier, Job: job, Step: step, WorldSize: ws, RanksHere: here, WrittenUnixNano: 1}
	for r := range ws {
		pm.Shards = append(pm.Shards, &agentpb.TierShard{Rank: r, SizeBytes: uint64(100 + r), HeaderChecksum: sum(r)})
	}
	return pm
}

// copiesOn returns the nodes holding rank's copies of a step on tier.
func copiesOn(c *Coordinator, job string, step int64, rank uint32, tier string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	if j := c.state.Jobs[job]; j != nil && j.Steps[step] != nil {
		for _, cp := range j.Steps[step].Copies[rank] {
			if cp.Tier == tier {
				out = append(out, cp.Node)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestRediscoveryMergeRules: the rules by which listed manifests enter the
// index, one by one: an unknown job and step come from an object store's
// manifest; a copy already known is left alone; a node-local copy grows
// with each node's manifest and places its ranks; a manifest that
// disagrees with the index is refused; a copy of a step an operator
// deleted is deleted, not indexed; a copy forgotten during a listing does
// not come back; a step of an older world size keeps its own; and all of
// it is back after a restart on the same store.
func TestRediscoveryMergeRules(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	c := newTestCoordinator(t, dir)
	tr := c.tiers
	merge := func(node string, pms ...*agentpb.TierManifest) listStats {
		t.Helper()
		s := tr.mergePage(node, pms)
		if s.failed != nil {
			t.Fatal(s.failed)
		}
		return s
	}

	// An object store's copy of a job the index does not know.
	if s := merge("node-0", listed("s3", "j", 5, 2, nil, nil)); s.added != 1 {
		t.Fatalf("first s3 manifest: %+v", s)
	}
	c.mu.Lock()
	j := c.state.Jobs["j"]
	if j == nil || j.WorldSize != 2 || j.Latest != 5 || j.Steps[5].State != Consistent {
		t.Fatalf("job after an s3 manifest: %+v", j)
	}
	c.mu.Unlock()
	if got := copiesOn(c, "j", 5, 1, "s3"); !slices.Equal(got, []string{sharedNode}) {
		t.Fatalf("rank 1's s3 copy on %v", got)
	}
	if s := merge("node-1", listed("s3", "j", 5, 2, nil, nil)); s.known != 1 || s.added != 0 {
		t.Fatalf("the same copy again: %+v", s)
	}

	// NVMe: each node's manifest adds its ranks, and places them.
	if s := merge("node-0", listed("nvme", "j", 5, 2, []uint32{0}, nil)); s.added != 1 {
		t.Fatalf("node-0's nvme manifest: %+v", s)
	}
	if s := merge("node-1", listed("nvme", "j", 5, 2, []uint32{1}, nil)); s.added != 1 {
		t.Fatalf("node-1's nvme manifest: %+v", s)
	}
	if s := merge("node-1", listed("nvme", "j", 5, 2, []uint32{1}, nil)); s.known != 1 {
		t.Fatalf("node-1's nvme manifest again: %+v", s)
	}
	tc := tr.copies[tierKey{"j", 5, "nvme"}]
	if tc == nil || tc.State != tcDurable || !maps.Equal(tc.Holders, map[uint32]string{0: "node-0", 1: "node-1"}) || len(tc.Manifests) != 2 {
		t.Fatalf("nvme copy: %+v", tc)
	}
	if got := copiesOn(c, "j", 5, 1, "nvme"); !slices.Equal(got, []string{"node-1"}) {
		t.Fatalf("rank 1's nvme copy on %v", got)
	}
	if p := c.state.Jobs["j"].Placement; p[0] != "node-0" || p[1] != "node-1" {
		t.Fatalf("placement from the nvme manifests: %v", p)
	}

	// A pfs manifest of step 5 whose rank 0 is another checkpoint.
	other := func(r uint32) string { return fmt.Sprintf("%016x", 0xbad00+uint64(r)) }
	if s := merge("node-0", listed("pfs", "j", 5, 2, nil, other)); s.added != 0 || s.conflicts != 1 {
		t.Fatalf("a disagreeing manifest: %+v", s)
	}
	if tr.copies[tierKey{"j", 5, "pfs"}] != nil || len(copiesOn(c, "j", 5, 0, "pfs")) != 0 {
		t.Fatal("a disagreeing manifest entered the index")
	}

	// An operator deleted step 7 before its s3 copy was known: it is
	// deleted when found.
	tr.deleteStep("j", 7)
	if s := merge("node-0", listed("s3", "j", 7, 2, nil, nil)); s.deleted != 1 || s.added != 0 {
		t.Fatalf("a copy of a deleted step: %+v", s)
	}
	if tc := tr.copies[tierKey{"j", 7, "s3"}]; tc == nil || tc.State != tcDeleting || tr.pendingOrders(tc) != 1 {
		t.Fatalf("the deleted step's copy: %+v", tc)
	}
	if c.state.Jobs["j"].Steps[7] != nil {
		t.Fatal("a deleted step came back")
	}

	// A copy forgotten while a listing runs does not come back from it.
	tr.rd.running++
	tr.forget(tr.copies[tierKey{"j", 5, "s3"}])
	if s := merge("node-0", listed("s3", "j", 5, 2, nil, nil)); s.added != 0 {
		t.Fatalf("a copy forgotten during the listing: %+v", s)
	}
	tr.rd.running--

	// A step of an older world size keeps its own; the job keeps its.
	if s := merge("node-0", listed("pfs", "j", 3, 4, nil, nil)); s.added != 1 {
		t.Fatalf("a step at another world size: %+v", s)
	}
	if st := c.state.Jobs["j"].Steps[3]; st == nil || st.WorldSize != 4 || st.State != Consistent || c.state.Jobs["j"].WorldSize != 2 {
		t.Fatalf("step 3 at world size 4: %+v (job world size %d)", st, c.state.Jobs["j"].WorldSize)
	}

	// A restart on the same store: the rediscovered copies are back.
	c.Close()
	c = newTestCoordinator(t, dir)
	defer c.Close()
	tc = c.tiers.copies[tierKey{"j", 5, "nvme"}]
	if tc == nil || !tc.Rediscovered || tc.State != tcDurable || len(tc.Holders) != 2 {
		t.Fatalf("nvme copy after a restart: %+v", tc)
	}
	if got := copiesOn(c, "j", 5, 0, "nvme"); !slices.Equal(got, []string{"node-0"}) {
		t.Fatalf("rank 0's nvme copy after a restart on %v", got)
	}
	if st := c.state.Jobs["j"].Steps[3]; st == nil || st.WorldSize != 4 {
		t.Fatalf("step 3 after a restart: %+v", st)
	}
}
