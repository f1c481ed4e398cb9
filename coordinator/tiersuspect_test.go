package coordinator_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/tiers"
	"rewind.dev/rewind/transport"
)

// newPFSAndS3Cluster is a tier cluster of two nodes copying every step to
// the parallel filesystem and the object store.
func newPFSAndS3Cluster(t *testing.T, coordMods ...func(*coordinator.Config)) *tierCluster {
	return newTierCluster(t, 2, "pfs:every=1,keep=2;s3:every=1,keep=2", nil, coordMods...)
}

// waitPFSAndS3 waits for job's step 4 to be durable on pfs and s3.
func (tc *tierCluster) waitPFSAndS3(job string) {
	tc.t.Helper()
	tc.waitStarted(job, 4, []string{"pfs", "s3"})
	if got := tc.waitTiers(job); len(got["pfs"]) != 1 || len(got["s3"]) != 1 {
		tc.t.Fatalf("tier copies: %v, want step 4 on pfs and s3", got)
	}
}

// copyState returns the state the coordinator shows for rank's copy of
// job's step on tier.
func (tc *tierCluster) copyState(job string, step int64, rank uint32, tier string) (coordpb.CopyState, error) {
	st, err := tc.api.InspectStep(ctxT(tc.t), &coordpb.InspectStepRequest{Job: job, Step: step})
	if err != nil {
		return 0, err
	}
	for _, c := range st.Step.Copies {
		if c.Rank == rank && c.Tier == tier {
			return c.State, nil
		}
	}
	return 0, fmt.Errorf("no copy of rank %d on %s: %v", rank, tier, st.Step.Copies)
}

// waitMarkedCorrupt waits for the coordinator to show rank's copy of
// job's step on tier as corrupt, and fails unless a restore plan then
// leaves it out of the rank's sources.
func (tc *tierCluster) waitMarkedCorrupt(job string, step int64, rank uint32, tier string) {
	t := tc.t
	t.Helper()
	wait.ForNil(t, 20*time.Second, fmt.Sprintf("rank %d's copy on %s marked corrupt", rank, tier), func() error {
		s, err := tc.copyState(job, step, rank, tier)
		if err == nil && s != coordpb.CopyState_COPY_STATE_CORRUPT {
			err = fmt.Errorf("it is %s", s.Label())
		}
		return err
	})
	plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: step, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range plan.Ranks {
		for _, s := range r.Sources {
			if r.Rank == rank && s.Tier == tier {
				t.Fatalf("the plan still restores rank %d from its corrupt copy on %s: %v", rank, tier, r.Sources)
			}
		}
	}
}

// TestAnOnDemandPullReportsACorruptTierCopy: a rank's shard has no leaf
// hashes beside it on either tier, so a ranged read pulls it whole; a
// byte of the parallel filesystem's copy rots, the pull fails its
// checksum there and takes the object store's copy. The agent reports
// the copy, the coordinator verifies it and marks it corrupt: no later
// plan offers it.
func TestAnOnDemandPullReportsACorruptTierCopy(t *testing.T) {
	tc := newPFSAndS3Cluster(t)
	big, bias := saveReshardModel(t, tc.cluster, "rsp", 4)
	tc.waitPFSAndS3("rsp")
	for _, tier := range []string{"pfs", "s3"} {
		if err := tc.storeOf(0, tier).Delete(ctxT(t), tiers.LeavesName("rsp", 4, 1)); err != nil {
			t.Fatal(err)
		}
	}
	tc.rotBig("rsp", 4, 1, 12345)
	tc.loseMemory("rsp", 4, tc.pfsAndS3)
	// New rank 2 of 8 reads rows 1024 to 1535 of big, rank 1's.
	restoreNewRank(t, tc.cluster, 0, "rsp", 2, make([]byte, len(big)), make([]byte, len(bias)))
	tc.waitMarkedCorrupt("rsp", 4, 1, "pfs")
	if s, err := tc.copyState("rsp", 4, 1, "s3"); err != nil || s != coordpb.CopyState_COPY_STATE_COMMITTED {
		t.Fatalf("rank 1's copy on s3: %v %v, want committed", s.Label(), err)
	}
}

// TestAMissingOrUnreachableTierCopyIsNotMarkedCorrupt: a copy that cannot
// be read is no corruption. Rank 1's shard is gone from the parallel
// filesystem and the object store is down: node-0's read of it fails and
// reports nothing; a report of either copy all the same (a lying or
// broken node) is verified first, which cannot read them, and marks
// neither. Once the store is back, a rotten leaf of rank 0 that node-0
// reads next is reported and marked: node-0's reports, sent in order,
// went out, and none was of rank 1 or the store.
func TestAMissingOrUnreachableTierCopyIsNotMarkedCorrupt(t *testing.T) {
	var logs testcluster.Logs
	tc := newPFSAndS3Cluster(t, func(c *coordinator.Config) { c.Logger = logs.Logger(slog.LevelInfo) })
	big, bias := saveReshardModel(t, tc.cluster, "rsm", 4)
	tc.waitPFSAndS3("rsm")
	if err := os.Remove(filepath.Join(tc.pfs, tiers.ShardName("rsm", 4, 1))); err != nil {
		t.Fatal(err)
	}
	tc.rotBig("rsm", 4, 0, 12345) // new rank 0's first leaf
	tc.loseMemory("rsm", 4, tc.pfsAndS3)
	if err := tc.minio.Stop(); err != nil {
		t.Fatal(err)
	}
	// New rank 2 of 8 reads rank 1's rows.
	if _, err := tryRestoreNewRank(t, tc.cluster, 0, "rsm", 2, make([]byte, len(big)), make([]byte, len(bias))); err == nil {
		t.Fatal("new rank 2 restored with rank 1's copies gone and down")
	}
	liar := testcluster.DialCoordinatorAs(t, tc.addr, transport.Identity{Role: transport.RoleNode, Name: "node-1"})
	report := func(node, tier string) (*coordpb.SuspectTierCopyResponse, error) {
		return liar.SuspectTierCopy(ctxT(t), &coordpb.SuspectTierCopyRequest{Node: node, Job: "rsm", Step: 4, Rank: 1, Tier: tier, Problem: "said so"})
	}
	if _, err := report("node-0", "pfs"); status.Code(err) != codes.PermissionDenied && !testcluster.Plaintext() {
		t.Fatalf("node-1 reporting for node-0: %v, want PermissionDenied", err)
	}
	for _, tier := range []string{"pfs", "s3"} {
		resp, err := report("node-1", tier)
		if err != nil || resp.Answer != coordpb.SuspectAnswer_SUSPECT_ANSWER_CHECKING {
			t.Fatalf("a report of rank 1's copy on %s: %v %v, want it checked", tier, resp, err)
		}
		wait.ForNil(t, 30*time.Second, "the check of rank 1's copy on "+tier, func() error {
			if !logs.Has("could not be checked: not marked", "job=rsm", "rank=1", "tier="+tier) {
				return fmt.Errorf("not over")
			}
			return nil
		})
		if s, err := tc.copyState("rsm", 4, 1, tier); err != nil || s != coordpb.CopyState_COPY_STATE_COMMITTED {
			t.Fatalf("rank 1's copy on %s after a report it cannot be read to check: %v %v, want committed", tier, s.Label(), err)
		}
	}
	if err := tc.minio.Start(); err != nil {
		t.Fatal(err)
	}
	restoreNewRank(t, tc.cluster, 0, "rsm", 0, make([]byte, len(big)), make([]byte, len(bias)))
	tc.waitMarkedCorrupt("rsm", 4, 0, "pfs")
	reported := func(rank uint32, tier string) bool {
		return logs.Has("a node reports a tier copy's shard corrupt", "job=rsm", fmt.Sprintf("rank=%d", rank), "tier="+tier, "node=node-0")
	}
	if !reported(0, "pfs") || reported(1, "pfs") || reported(1, "s3") || reported(0, "s3") {
		t.Fatalf("node-0's reports: rank 0 pfs %t (want true), rank 1 pfs %t, rank 1 s3 %t, rank 0 s3 %t (want false)",
			reported(0, "pfs"), reported(1, "pfs"), reported(1, "s3"), reported(0, "s3"))
	}
}

// reportAs returns a function that sends node's report of rank's copy of
// job's step on tier, over a connection with node's identity.
func (tc *tierCluster) reportAs(node, job string, step int64) func(rank uint32, tier string) coordpb.SuspectAnswer {
	t := tc.t
	c := testcluster.DialCoordinatorAs(t, tc.addr, transport.Identity{Role: transport.RoleNode, Name: node})
	return func(rank uint32, tier string) coordpb.SuspectAnswer {
		t.Helper()
		resp, err := c.SuspectTierCopy(ctxT(t), &coordpb.SuspectTierCopyRequest{Node: node, Job: job, Step: step, Rank: rank, Tier: tier, Problem: "said so"})
		if err != nil {
			t.Fatalf("%s's report of rank %d on %s: %v", node, rank, tier, err)
		}
		return resp.Answer
	}
}

// waitCommitted waits for the coordinator's log to have every one of
// logged, then fails unless rank's copy of job's step on tier is still
// committed.
func (tc *tierCluster) waitCommitted(logs *testcluster.Logs, job string, step int64, rank uint32, tier string, logged ...string) {
	t := tc.t
	t.Helper()
	wait.For(t, 30*time.Second, fmt.Sprintf("the coordinator to log %q", logged), func() bool { return logs.Has(logged...) })
	if s, err := tc.copyState(job, step, rank, tier); err != nil || s != coordpb.CopyState_COPY_STATE_COMMITTED {
		t.Fatalf("rank %d's copy on %s: %v %v, want committed", rank, tier, s.Label(), err)
	}
}

// TestAReportOfAGoodTierCopyChangesNothing: node-1 reports rank 0's copy
// on the object store corrupt, which it is not: node-0, not the
// reporter, verifies it whole, the copy stays committed, and a second
// report within the recheck period is not checked again. Rank 1's leaf
// hashes on the parallel filesystem are rotten, its shard whole: a
// report of it, then rewind verify, leave the copy committed and the leaf
// hashes written again.
func TestAReportOfAGoodTierCopyChangesNothing(t *testing.T) {
	var logs testcluster.Logs
	tc := newPFSAndS3Cluster(t, func(c *coordinator.Config) { c.Logger = logs.Logger(slog.LevelInfo) })
	saveReshardModel(t, tc.cluster, "rsg", 4)
	tc.waitPFSAndS3("rsg")
	report := tc.reportAs("node-1", "rsg", 4)
	if a := report(0, "s3"); a != coordpb.SuspectAnswer_SUSPECT_ANSWER_CHECKING {
		t.Fatalf("a report of rank 0's copy on s3: %s, want checking", a.Label())
	}
	tc.waitCommitted(&logs, "rsg", 4, 0, "s3", "verified whole", "rank=0", "tier=s3", "reporter=node-1", "verifier=node-0")
	if a := report(0, "s3"); a != coordpb.SuspectAnswer_SUSPECT_ANSWER_VERIFIED_RECENTLY {
		t.Fatalf("a second report of rank 0's copy on s3: %s, want verified_recently", a.Label())
	}

	leaves := filepath.Join(tc.pfs, filepath.FromSlash(tiers.LeavesName("rsg", 4, 1)))
	good, err := os.ReadFile(leaves)
	if err != nil {
		t.Fatal(err)
	}
	rot := func() {
		t.Helper()
		b := slices.Clone(good)
		b[len(b)-1] ^= 0x40
		if err := os.WriteFile(leaves, b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	mended := func(after string) {
		t.Helper()
		if b, err := os.ReadFile(leaves); err != nil || !bytes.Equal(b, good) {
			t.Fatalf("rank 1's leaf hashes on pfs after %s: %d bytes, %v; want them written again", after, len(b), err)
		}
	}
	rot()
	if a := report(1, "pfs"); a != coordpb.SuspectAnswer_SUSPECT_ANSWER_CHECKING {
		t.Fatalf("a report of rank 1's copy on pfs: %s, want checking", a.Label())
	}
	tc.waitCommitted(&logs, "rsg", 4, 1, "pfs", "verified whole", "rank=1", "tier=pfs", "reporter=node-1", "verifier=node-0")
	mended("a report")
	rot()
	v, err := tc.api.VerifyStep(ctxT(t), &coordpb.StepRequest{Job: "rsg", Step: 4})
	if err != nil || !v.Ok {
		t.Fatalf("rewind verify with rank 1's leaf hashes rotten on pfs: %v %v, want ok", v, err)
	}
	tc.waitCommitted(&logs, "rsg", 4, 1, "pfs")
	mended("rewind verify")
}

// TestTheReporterNeverVerifiesItsOwnReport: with node-0 gone, node-1 is
// the only node with the shared tiers; its report of rank 0's copy on the
// object store (whole, but a broken or hostile node would answer its own
// verify as it pleases) is not checked by itself: the check waits for
// another node, gives up, and marks nothing.
func TestTheReporterNeverVerifiesItsOwnReport(t *testing.T) {
	var logs testcluster.Logs
	tc := newPFSAndS3Cluster(t, func(c *coordinator.Config) { c.Logger = logs.Logger(slog.LevelInfo) })
	saveReshardModel(t, tc.cluster, "rso", 4)
	tc.waitPFSAndS3("rso")
	tc.agents[0].Stop()
	wait.ForNil(t, 10*time.Second, "node-0's order stream closed", func() error {
		st, err := tc.api.TierStatus(ctxT(t), &coordpb.TierStatusRequest{})
		if err == nil && (len(st.Nodes) != 1 || st.Nodes[0].Node != "node-1") {
			err = fmt.Errorf("connected: %v", st.Nodes)
		}
		return err
	})
	report := tc.reportAs("node-1", "rso", 4)
	if a := report(0, "s3"); a != coordpb.SuspectAnswer_SUSPECT_ANSWER_CHECKING {
		t.Fatalf("a report of rank 0's copy on s3: %s, want checking", a.Label())
	}
	tc.waitCommitted(&logs, "rso", 4, 0, "s3", "could not be checked: not marked", "rank=0", "tier=s3", "reporter=node-1", "but node node-1")
	if logs.Has("verifier=node-1") {
		t.Fatalf("node-1 verified its own report:\n%s", logs.String())
	}
	if a := report(0, "s3"); a != coordpb.SuspectAnswer_SUSPECT_ANSWER_CHECKING {
		t.Fatalf("a report of rank 0's copy on s3 after a check that could not verify it: %s, want checking (not verified whole)", a.Label())
	}
}
