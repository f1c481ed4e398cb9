package coordinator

import (
	"path/filepath"
	"testing"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/tiers"
)

// TestAPartlyRediscoveredCopyIsNotDurable: a node-local copy rebuilt from
// the manifests of some of the nodes holding it (the others not listed
// yet, or gone) is shown copying with the ranks found so far, and
// retention neither keeps it nor counts it: here steps 3, 4 and 5 are
// whole on NVMe with keep=2, and step 7 is found on one node of three.
// Counted, it would have made retention delete step 4, one of the two
// newest whole copies (found by the chaos suite's coordinator-kill-loop:
// "step 94 on nvme is durable with 2 of 3 ranks").
func TestAPartlyRediscoveredCopyIsNotDurable(t *testing.T) {
	tr, merge := nvmeKeepTwo(t)
	for _, step := range []int64{3, 4, 5} {
		for r, node := range []string{"node-0", "node-1", "node-2"} {
			merge(node, step, uint32(r))
		}
	}
	merge("node-0", 7, 0)

	tr.mu.Lock()
	defer tr.mu.Unlock()
	part := tr.copies[tierKey{"k", 7, "nvme"}].proto()
	if part.State != coordpb.TierCopyState_TIER_COPY_STATE_COPYING || part.RanksDone != 1 || part.Error == "" {
		t.Fatalf("step 7 found on one node of three: %v", part)
	}
	if whole := tr.copies[tierKey{"k", 5, "nvme"}].proto(); whole.State != coordpb.TierCopyState_TIER_COPY_STATE_DURABLE || whole.RanksDone != 3 {
		t.Fatalf("step 5 found on all three nodes: %v", whole)
	}
	tr.retain("k", "nvme")
	for step, want := range map[int64]tierCopyState{3: tcDeleting, 4: tcDurable, 5: tcDurable, 7: tcDurable} {
		if got := tr.copies[tierKey{"k", step, "nvme"}].State; got != want {
			t.Errorf("after retention (keep=2) step %d on nvme is %s, want %s", step, got, want)
		}
	}
}

// TestAPartlyRediscoveredCopyGoesWhenOlderThanTheKept: a copy found on one
// node of three whose other nodes never come back is deleted once the
// policy's count of whole copies newer than it is kept, as any old copy
// is; else it stayed on that node's disk, and in the index, for good.
func TestAPartlyRediscoveredCopyGoesWhenOlderThanTheKept(t *testing.T) {
	tr, merge := nvmeKeepTwo(t)
	merge("node-0", 1, 0) // nodes 1 and 2 never list step 1
	merge("node-0", 6, 0) // nor step 6, newer than the oldest whole copy kept
	for _, step := range []int64{3, 4, 5} {
		for r, node := range []string{"node-0", "node-1", "node-2"} {
			merge(node, step, uint32(r))
		}
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.retain("k", "nvme")
	for step, want := range map[int64]tierCopyState{1: tcDeleting, 3: tcDeleting, 4: tcDurable, 5: tcDurable, 6: tcDurable} {
		if got := tr.copies[tierKey{"k", step, "nvme"}].State; got != want {
			t.Errorf("after retention (keep=2) step %d on nvme is %s, want %s", step, got, want)
		}
	}
}

// nvmeKeepTwo returns the tiering of a coordinator whose job k keeps two
// copies on NVMe, and a merge of one node's manifest of one rank of a
// step of k at world size 3, as that node's listing brings it.
func nvmeKeepTwo(t *testing.T) (*tiering, func(node string, step int64, rank uint32)) {
	t.Helper()
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	tr := c.tiers
	p, err := tiers.ParsePolicy("nvme:every=1,keep=2")
	if err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	tr.policies["k"] = p
	tr.mu.Unlock()
	return tr, func(node string, step int64, rank uint32) {
		t.Helper()
		if s := tr.mergePage(node, []*agentpb.TierManifest{listed("nvme", "k", step, 3, []uint32{rank}, nil)}); s.failed != nil {
			t.Fatal(s.failed)
		}
	}
}
