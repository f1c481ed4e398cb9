package coordinator_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// loseMemory stops every agent of tc and starts new ones under the same
// names with empty memory and the stores stores gives each node: the
// cluster's clients then talk to them. It returns once the coordinator's
// plan for job's step has no memory source left.
func (tc *tierCluster) loseMemory(job string, step int64, stores func(node int) map[tiers.Name]tiers.Store) {
	t := tc.t
	t.Helper()
	for _, a := range tc.agents {
		a.Stop()
	}
	for i := range tc.agents {
		cfg := testcluster.AgentConfig(t)
		cfg.Node, cfg.CoordinatorAddr, cfg.Stores = fmt.Sprintf("node-%d", i), tc.addr, stores(i)
		cfg.Logger = testcluster.Discard()
		tc.agents[i] = startAgent(t, cfg)
		tc.clients[i] = testcluster.Dial(t, cfg.Socket)
	}
	wait.ForNil(t, 10*time.Second, "a plan with no memory source after every node lost its memory", func() error {
		plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: step, DryRun: true})
		if err != nil {
			return err
		}
		for _, r := range plan.Ranks {
			for _, s := range r.Sources {
				if s.Tier == "shm" {
					return fmt.Errorf("rank %d still has a memory source on %s", r.Rank, s.Node)
				}
			}
		}
		return nil
	})
}

// TestReshardFromATier: a step saved by 4 ranks, copied to the object
// store, restores at world size 8 after every node lost its memory: each
// new rank's agent reads from the store only the shards' headers, their
// leaf hashes and the 1 MiB leaves its slices touch (2 MiB of big and
// bias's one leaf, of 16 MiB saved), and the tensor assembled from the
// new ranks is the saved one bit for bit.
func TestReshardFromATier(t *testing.T) {
	tc := newTierCluster(t, 2, "s3:every=1,keep=2", nil)
	big, bias := saveReshardModel(t, tc.cluster, "rst", 4)
	tc.waitStarted("rst", 4, []string{"s3"})
	if got := tc.waitTiers("rst"); len(got["s3"]) != 1 {
		t.Fatalf("s3 copies: %v, want step 4", got)
	}
	s3 := tc.storeOf(0, "s3")
	tc.loseMemory("rst", 4, func(int) map[tiers.Name]tiers.Store { return map[tiers.Name]tiers.Store{"s3": s3} })
	restoreRanged(t, tc.cluster, "rst", func(j int) int { return j % 2 }, big, bias, "the object store")
	tc.holdNone("rst")
}

// holdNone fails unless no node holds a shard of job: ranged reads leave
// nothing behind.
func (tc *tierCluster) holdNone(job string) {
	tc.t.Helper()
	for i, c := range tc.clients {
		if shards, err := c.List(ctxT(tc.t), job); err != nil || len(shards) != 0 {
			tc.t.Fatalf("node-%d holds %d shards of %s after ranged reads of the tiers (%v), want none", i, len(shards), job, err)
		}
	}
}

// TestReshardFromATierFallsBackFromACorruptByte: a byte of the parallel
// filesystem's copy rots; the ranged read of the leaf that holds it is
// refused and that leaf, and only what is still missing, is read from the
// object store's copy: the restore at another world size is bit-exact.
// The agent that read it reports the copy, the coordinator verifies the
// shard on the tier and marks it corrupt: no later plan offers it.
func TestReshardFromATierFallsBackFromACorruptByte(t *testing.T) {
	tc := newPFSAndS3Cluster(t)
	big, bias := saveReshardModel(t, tc.cluster, "rsc", 4)
	tc.waitPFSAndS3("rsc")
	// Rank 1 holds rows 1024 to 2047 of big; new rank 2 of 8 reads rows
	// 1024 to 1535, the first two leaves of rank 1's piece.
	tc.rotBig("rsc", 4, 1, 1<<20+12345) // big's second leaf
	tc.loseMemory("rsc", 4, tc.pfsAndS3)
	restoreRanged(t, tc.cluster, "rsc", func(j int) int { return j % 2 }, big, bias, "the tiers (the rotten leaf from s3)")
	tc.holdNone("rsc")
	tc.waitMarkedCorrupt("rsc", 4, 1, "pfs")
}

// rotBig inverts a byte of rank's shard of job's step on the parallel
// filesystem: the one at off in the data of tensor big.
func (tc *tierCluster) rotBig(job string, step int64, rank uint32, off int64) {
	t := tc.t
	t.Helper()
	f, err := os.OpenFile(filepath.Join(tc.pfs, tiers.ShardName(job, step, rank)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := shm.Decode(f, statSize(t, f))
	if err != nil {
		t.Fatal(err)
	}
	flip(t, f, h.DataStart+h.Tensor("big").Begin+off)
}

// pfsAndS3 gives node i the parallel filesystem and the object store.
func (tc *tierCluster) pfsAndS3(i int) map[tiers.Name]tiers.Store {
	return map[tiers.Name]tiers.Store{"pfs": tc.storeOf(i, "pfs"), "s3": tc.storeOf(i, "s3")}
}

// TestReshardFromATierCopyWithoutLeafHashes: a tier copy with no leaf
// hashes beside it (pushed before they were written, or their write
// failed) still restores at another world size: its shards are pulled
// whole, checked against their checksums.
func TestReshardFromATierCopyWithoutLeafHashes(t *testing.T) {
	tc := newTierCluster(t, 2, "pfs:every=1,keep=2", nil)
	big, bias := saveReshardModel(t, tc.cluster, "rsw", 4)
	tc.waitStarted("rsw", 4, []string{"pfs"})
	tc.waitTiers("rsw")
	for r := range uint32(4) {
		if err := os.Remove(filepath.Join(tc.pfs, tiers.LeavesName("rsw", 4, r))); err != nil {
			t.Fatal(err)
		}
	}
	tc.loseMemory("rsw", 4, func(i int) map[tiers.Name]tiers.Store { return map[tiers.Name]tiers.Store{"pfs": tc.storeOf(i, "pfs")} })
	gotBig, gotBias := make([]byte, len(big)), make([]byte, len(bias))
	res := restoreNewRank(t, tc.cluster, 0, "rsw", 3, gotBig, gotBias)
	const rows = bigRows / 8
	if res.Fetched != 0 || !bytes.Equal(gotBias, bias) || !bytes.Equal(gotBig[3*rows*bigCols:4*rows*bigCols], big[3*rows*bigCols:4*rows*bigCols]) {
		t.Fatalf("new rank 3 from a tier copy without leaf hashes: %d bytes fetched in ranges (want 0: pulled whole), slices equal %t",
			res.Fetched, bytes.Equal(gotBias, bias))
	}
}

// TestRangedReadOfATierCopyInChunks: a slice of 24 MiB of a 40 MiB shard
// on the object store is read in several ranged reads at once (8 leaves
// each), every leaf once and checked.
func TestRangedReadOfATierCopyInChunks(t *testing.T) {
	tc := newTierCluster(t, 1, "s3:every=1,keep=2", nil)
	const rows, row = 40, 1 << 20
	huge := make([]byte, rows*row)
	for i := range huge {
		huge[i] = byte(i>>20 + i*3)
	}
	s, err := tc.clients[0].Session("rsk", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(ctxT(t), 1, []sdk.Tensor{{Name: "huge", DType: shm.U8, Shape: []int64{rows, row}, Data: huge}}, nil); err != nil {
		t.Fatal(err)
	}
	s.Close()
	tc.waitLatest("rsk", 1)
	tc.waitStarted("rsk", 1, []string{"s3"})
	tc.waitTiers("rsk")
	s3 := tc.storeOf(0, "s3")
	tc.loseMemory("rsk", 1, func(int) map[tiers.Name]tiers.Store { return map[tiers.Name]tiers.Store{"s3": s3} })
	s, err = tc.clients[0].Session("rsk", 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := make([]byte, 24*row)
	res, err := s.RestoreInto(ctxT(t), sdk.Layout{Slices: []sdk.Slice{{Name: "huge", DType: shm.U8, Offsets: []int64{3, 0}, Lengths: []int64{24, row}, Data: got}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Fetched != 24*row || !bytes.Equal(got, huge[3*row:27*row]) {
		t.Fatalf("rows 3 to 26 of a 40 MiB shard on s3: %d bytes fetched (want %d), equal %t", res.Fetched, 24*row, bytes.Equal(got, huge[3*row:27*row]))
	}
}
