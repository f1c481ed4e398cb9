package coordinator_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/tiers"
)

// Tier copies recorded durable whose objects later went missing (deleted
// by hand, a bucket wiped, a node's NVMe replaced): once a read of the
// copy finds them gone, the coordinator must stop counting the copy, so
// that retention keeps the policy's count of copies that are there.

// tierCopyOf returns the state and error the coordinator shows for job's
// step on tier, or false when it shows none.
func (tc *tierCluster) tierCopyOf(job string, step int64, tier string) (*coordpb.TierCopy, bool) {
	tc.t.Helper()
	st, err := tc.api.InspectStep(ctxT(tc.t), &coordpb.InspectStepRequest{Job: job, Step: step})
	if err != nil {
		return nil, false
	}
	for _, c := range st.Step.Tiers {
		if c.Tier == tier {
			return c, true
		}
	}
	return nil, false
}

// TestVerifyOfAVanishedTierCopyStopsItCounting: the parallel filesystem
// keeps two copies; step 2's shard is deleted from it after the copy was
// recorded durable. rewind verify of step 2 says the copy is missing,
// and the coordinator no longer shows it durable nor plans from it; once
// step 3 is durable, retention keeps step 1 (the only other copy that is
// there) rather than deleting it for the missing step 2, and step 1
// still restores from the tier.
func TestVerifyOfAVanishedTierCopyStopsItCounting(t *testing.T) {
	const job = "vanished"
	tc := fileTierCluster(t, 1, "pfs:every=1,keep=2")
	for step := int64(1); step <= 2; step++ {
		tc.saveStep(job, 1, step, 0)
		tc.waitLatest(job, step)
		tc.waitStarted(job, step, []string{"pfs"})
		tc.waitTiers(job)
	}
	if err := os.Remove(filepath.Join(tc.pfs, filepath.FromSlash(tiers.ShardName(job, 2, 0)))); err != nil {
		t.Fatal(err)
	}
	v, err := tc.api.VerifyStep(ctxT(t), &coordpb.StepRequest{Job: job, Step: 2})
	if err != nil || v.Ok {
		t.Fatalf("verify of step 2 with its pfs shard gone: %v %v, want it to fail", v, err)
	}
	var pfsCheck *coordpb.CopyCheck
	for _, c := range v.Checks {
		if c.Copy.Tier == "pfs" {
			pfsCheck = c
		}
	}
	if pfsCheck == nil || pfsCheck.Ok || !strings.Contains(pfsCheck.Problem, "missing") {
		t.Fatalf("verify's check of the pfs copy: %v, want it failed naming the missing shard", pfsCheck)
	}
	if c, ok := tc.tierCopyOf(job, 2, "pfs"); !ok || c.State == coordpb.TierCopyState_TIER_COPY_STATE_DURABLE || !strings.Contains(c.Error, "missing") {
		t.Fatalf("step 2 on pfs after verify found its shard gone: %v, want it no longer durable, naming the missing shard", c)
	}
	plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: 2, DryRun: true})
	if err == nil {
		for _, s := range plan.Ranks[0].Sources {
			if s.Tier == "pfs" {
				t.Fatalf("a plan of step 2 still lists its missing pfs copy: %v", plan.Ranks[0].Sources)
			}
		}
	}

	tc.saveStep(job, 1, 3, 0)
	tc.waitLatest(job, 3)
	tc.waitStarted(job, 3, []string{"pfs"})
	if got := tc.waitTiers(job); !slices.Equal(got["pfs"], []int64{1, 3}) {
		t.Fatalf("durable pfs copies after step 3: %v, want steps 1 and 3 (step 2's is missing)", got)
	}
	pfs := tc.storeOf(0, "pfs")
	wait.ForNil(t, 10*time.Second, "the pfs manifests to be those of steps 1 and 3", func() error {
		if steps, names := onStore(t, pfs, job); !slices.Equal(steps, []int64{1, 3}) {
			return fmt.Errorf("manifests of steps %v: %v", steps, names)
		}
		return nil
	})
	if _, err := tc.agents[0].Agent.VerifyTier(ctxT(t), "pfs", job, 0, 1); err != nil {
		t.Fatalf("step 1's pfs copy, kept by retention: %v", err)
	}
}

// TestARestoreLearnsOfAReplacedNodesNVMe: node-1 is replaced, its memory
// and its NVMe gone, under the same name, and node-0 restarts with its
// memory lost. Step 4 is only on the NVMe tier, so rank 1 has no copy of
// it left: an operator's restore passes over it, naming rank 1's NVMe
// copy, and restores step 3, whose rank 1 the parallel filesystem still
// holds. The restore's fetches that found node-1's NVMe empty teach the
// coordinator: node-1's NVMe copies show missing, leave restore plans,
// and retention no longer counts them.
func TestARestoreLearnsOfAReplacedNodesNVMe(t *testing.T) {
	const job = "replaced"
	tc := fileTierCluster(t, 2, "nvme:every=1,keep=2;pfs:every=2,keep=2")
	for step := int64(1); step <= 4; step++ {
		tc.saveStep(job, 2, step, 0, 1)
		tc.waitLatest(job, step)
		due := []string{"nvme"}
		if step%2 == 1 {
			due = append(due, "pfs")
		}
		tc.waitStarted(job, step, due)
		tc.waitTiers(job)
	}
	if got := tc.waitTiers(job); !slices.Equal(got["nvme"], []int64{3, 4}) || !slices.Equal(got["pfs"], []int64{1, 3}) {
		t.Fatalf("durable copies: %v, want nvme 3 and 4, pfs 1 and 3", got)
	}
	tc.agents[1].Stop()
	if err := os.RemoveAll(tc.nvme[1]); err != nil {
		t.Fatal(err)
	}
	tc.cfgs[1].Stores["nvme"] = tc.storeOf(1, "nvme") // the new node's empty disk
	tc.restartAgents(job, 2, 3)

	plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, RequestedBy: "test"})
	if err != nil || !plan.Ok || plan.Step != 3 {
		t.Fatalf("restore after node-1's replacement: %v %v, want step 3", plan, err)
	}
	if len(plan.Skipped) != 1 || plan.Skipped[0].Step != 4 || len(plan.Skipped[0].Ranks) != 1 || plan.Skipped[0].Ranks[0].Rank != 1 ||
		len(plan.Skipped[0].Ranks[0].Copies) != 1 || plan.Skipped[0].Ranks[0].Copies[0].Copy != "nvme:node-1" {
		t.Fatalf("steps passed over: %v, want step 4 for rank 1's copy on node-1's NVMe", plan.Skipped)
	}
	if rp := plan.Ranks[1]; rp.Used != "pfs:-" {
		t.Fatalf("rank 1 of step 3 restored from %q (failed: %v), want the parallel filesystem", rp.Used, rp.Failed)
	}
	tc.checkRestoredAt(job, 3, map[uint32]int{0: 0, 1: 1})

	for _, step := range []int64{3, 4} {
		wait.ForNil(t, 20*time.Second, fmt.Sprintf("step %d's NVMe copy shown missing rank 1", step), func() error {
			c, ok := tc.tierCopyOf(job, step, "nvme")
			if !ok || c.State != coordpb.TierCopyState_TIER_COPY_STATE_CORRUPT || !strings.Contains(c.Error, "rank 1 missing") {
				return fmt.Errorf("step %d on nvme: %v", step, c)
			}
			return nil
		})
		if s, err := tc.copyState(job, step, 1, "nvme"); err != nil || s != coordpb.CopyState_COPY_STATE_CORRUPT {
			t.Fatalf("rank 1's NVMe copy of step %d: %v %v, want it out of restore plans", step, s.Label(), err)
		}
	}
	// Step 5 is durable on NVMe: the copies of steps 3 and 4 are not
	// counted among the two kept, and retention removes them.
	tc.saveStep(job, 2, 5, 0, 1)
	tc.waitLatest(job, 5)
	tc.waitStarted(job, 5, []string{"nvme"})
	if got := tc.waitTiers(job); !slices.Equal(got["nvme"], []int64{5}) {
		t.Fatalf("durable NVMe copies after step 5: %v, want step 5 alone", got)
	}
}

// TestARestoreAfterTheBucketIsGone: every step's only durable copy is on
// the object store, whose bucket is then deleted with every object (as a
// MinIO restarted on an empty data directory serves none), and every
// node loses its memory. An operator's restore fails, switching nothing,
// naming each step it tried with each rank's object-store copy; the
// coordinator learns that the copies are missing, and rewind verify says
// so.
func TestARestoreAfterTheBucketIsGone(t *testing.T) {
	const job = "nobucket"
	tc := newTierCluster(t, 2, "s3:every=1,keep=2", nil)
	tc.saveDurable(job, 3, "s3")
	mc := tc.minio.Client()
	for obj := range mc.ListObjects(ctxT(t), tc.minio.Bucket, minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		if err := mc.RemoveObject(ctxT(t), tc.minio.Bucket, obj.Key, minio.RemoveObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := mc.RemoveBucket(ctxT(t), tc.minio.Bucket); err != nil {
		t.Fatal(err)
	}
	tc.restartAgents(job, 2, 3)

	plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, RequestedBy: "test"})
	if err == nil {
		t.Fatalf("restore with the bucket gone: %v", plan)
	}
	for _, want := range []string{"step 3 (rank 0: s3:- failed", "step 2 (rank 0: s3:- failed", "rank 1: s3:- failed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the restore's error lacks %q: %v", want, err)
		}
	}
	for node, c := range tc.clients {
		if shards, err := c.List(ctxT(t), job); err != nil || len(shards) != 0 {
			t.Fatalf("node-%d holds %d shards of the job after the failed restore: %v %v", node, len(shards), shards, err)
		}
	}
	for _, step := range []int64{2, 3} {
		wait.ForNil(t, 30*time.Second, fmt.Sprintf("step %d's object-store copy shown missing", step), func() error {
			c, ok := tc.tierCopyOf(job, step, "s3")
			if !ok || c.State != coordpb.TierCopyState_TIER_COPY_STATE_CORRUPT || !strings.Contains(c.Error, "rank 0 missing") ||
				!strings.Contains(c.Error, "rank 1 missing") {
				return fmt.Errorf("step %d on s3: %v", step, c)
			}
			return nil
		})
	}
	v, err := tc.api.VerifyStep(ctxT(t), &coordpb.StepRequest{Job: job, Step: 3})
	if err != nil || v.Ok || len(v.Checks) != 2 {
		t.Fatalf("verify of step 3 with the bucket gone: %v %v, want both copies failed", v, err)
	}
	for _, c := range v.Checks {
		if c.Ok || !strings.Contains(c.Problem, "missing") && !strings.Contains(c.Problem, "corrupt") {
			t.Fatalf("verify's check of rank %d: %v, want it missing", c.Copy.Rank, c)
		}
	}
}
