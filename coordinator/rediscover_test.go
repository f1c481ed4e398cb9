package coordinator_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/promtest"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/tiers"
)

// restartEmpty stops the cluster's coordinator and starts one on an empty
// store at the same address, with the cluster's policy and reg for its
// metrics.
func (tc *tierCluster) restartEmpty(policy string, reg *prometheus.Registry) {
	tc.t.Helper()
	tc.stop()
	p, _ := tiers.ParsePolicy(policy)
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	tc.addr, tc.stop = startCoordinator(tc.t, filepath.Join(tc.t.TempDir(), "empty"), tc.addr, func(c *coordinator.Config) {
		c.Policy, c.Registry = p, reg
	})
}

// waitDurable waits until job's durable tier copies are want, every other
// tier state aside, and returns them.
func (tc *tierCluster) waitDurable(job string, want map[string][]int64) {
	tc.t.Helper()
	wait.ForNil(tc.t, 10*time.Second, fmt.Sprintf("durable tier copies of %s %v", job, want), func() error {
		if _, err := tc.api.Latest(ctxT(tc.t), &coordpb.LatestRequest{Job: job}); err != nil {
			return err
		}
		got := map[string][]int64{}
		for tier, states := range tc.tierStates(job) {
			got[tier] = states["durable"]
		}
		if !maps.EqualFunc(got, want, slices.Equal) {
			return fmt.Errorf("durable copies %v", got)
		}
		return nil
	})
}

// rediscovered reads rewind_coordinator_tier_copies_rediscovered_total by tier.
func rediscovered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	s := promtest.Samples(t, reg)
	out := map[string]float64{}
	for _, tier := range []string{"nvme", "pfs", "s3"} {
		if v, ok := s[fmt.Sprintf("rewind_coordinator_tier_copies_rediscovered_total{tier=%q}", tier)]; ok {
			out[tier] = v
		}
	}
	return out
}

// TestTierCopiesRediscoveredOnEmptyStore: a job checkpoints six steps to
// NVMe, the parallel filesystem and S3 under a policy; the coordinator
// comes back on an empty store. Once the agents are back, the index lists
// the same durable copies on each tier as before (found on the tiers, not
// remembered), a restore plan uses them after every node lost its memory
// (bit-identical, from NVMe, and from S3 for a step only it holds), and
// retention counts them with the copies made after the restart.
func TestTierCopiesRediscoveredOnEmptyStore(t *testing.T) {
	const job, ws = "rediscover", 4
	const policy = "nvme:every=1,keep=2;pfs:every=2,keep=2;s3:every=3,keep=2"
	tc := newTierCluster(t, 2, policy, nil)
	tc.saveByPolicy(job, ws, policy, 6)
	// nvme: every step, keep 2; pfs: 1,3,5 keep 2; s3: 1,4 keep 2.
	want := map[string][]int64{"nvme": {5, 6}, "pfs": {3, 5}, "s3": {1, 4}}
	if got := tc.waitTiers(job); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("durable copies before the restart: %v, want %v", got, want)
	}

	reg := prometheus.NewRegistry()
	tc.restartEmpty(policy, reg)
	tc.waitDurable(job, want)
	tc.waitLatest(job, 6)
	// Each node's listing is counted as it is merged: the copies may be
	// durable before the last one is counted.
	wait.ForNil(t, 10*time.Second, "rediscovered counter: nvme 4 (2 steps on 2 nodes), pfs 2, s3 2", func() error {
		if got := rediscovered(t, reg); got["nvme"] != 4 || got["pfs"] != 2 || got["s3"] != 2 {
			return fmt.Errorf("counter %v", got)
		}
		return nil
	})
	st, err := tc.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: 1})
	if err != nil || st.Step.State != coordpb.StepState_STEP_STATE_CONSISTENT || st.Step.WorldSize != ws || len(st.Step.Copies) != ws || st.Step.Copies[0].Tier != "s3" {
		t.Fatalf("step 1, on S3 alone: %v %v", st, err)
	}

	// Every node loses its memory: fresh agents, the same names and stores.
	for _, a := range tc.agents {
		a.Stop()
	}
	tc.clients = nil
	for i := range 2 {
		cfg := testcluster.AgentConfig(t)
		cfg.Node, cfg.CoordinatorAddr, cfg.Stores = fmt.Sprintf("node-%d", i), tc.addr, tc.cfgs[i].Stores
		cfg.TransferBackoff = 50 * time.Millisecond
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		startAgent(t, cfg)
		tc.clients = append(tc.clients, testcluster.Dial(t, cfg.Socket))
	}
	// The fresh agents' empty inventories take the memory copies out.
	wait.ForNil(t, 10*time.Second, "a plan of step 6 with no memory copy after every node lost its memory", func() error {
		plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, DryRun: true})
		if err == nil && (plan.Step != 6 || slices.ContainsFunc(plan.Ranks, func(rp *coordpb.RankPlan) bool {
			return slices.ContainsFunc(rp.Sources, func(c *coordpb.Copy) bool { return c.Tier == "shm" })
		})) {
			err = fmt.Errorf("plan %v", plan)
		}
		return err
	})
	for _, c := range []struct {
		step int64
		used func(rank uint32) string
	}{
		{1, func(uint32) string { return "s3:-" }},                             // only the object store holds step 1
		{6, func(r uint32) string { return fmt.Sprintf("nvme:node-%d", r%2) }}, // each rank from its own node's NVMe; training resumes from it
	} {
		plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: c.step, RequestedBy: "test"})
		if err != nil || !plan.Ok || plan.Step != c.step {
			t.Fatalf("restore of step %d from the rediscovered copies: %v %v", c.step, plan, err)
		}
		for r := range uint32(ws) {
			if rp := plan.Ranks[r]; rp.Used != c.used(r) || rp.TargetNode != fmt.Sprintf("node-%d", r%2) {
				t.Fatalf("step %d rank %d restored on %s from %q, want %q on node-%d", c.step, r, rp.TargetNode, rp.Used, c.used(r), r%2)
			}
			s, _ := tc.clients[r%2].Session(job, r, ws)
			got, err := s.RestoreStep(ctxT(t), c.step)
			if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(c.step, r)) {
				t.Fatalf("rank %d of step %d after the restore: %v", r, c.step, err)
			}
			s.Close()
		}
	}

	// Retention counts the rediscovered copies: steps 7 and 8 go to NVMe
	// (5 and 6 leave), 7 to pfs (3 leaves) and to S3 (1 leaves).
	for step := int64(7); step <= 8; step++ {
		tc.saveStep(job, ws, step, 0, 1, 2, 3)
		tc.waitLatest(job, step)
		tc.waitStarted(job, step, []string{"nvme"})
		tc.waitTiers(job)
	}
	want = map[string][]int64{"nvme": {7, 8}, "pfs": {5, 7}, "s3": {4, 7}}
	if got := tc.waitTiers(job); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("durable copies after two more steps: %v, want %v", got, want)
	}
	// A step whose last copy retention removes (step 6: on NVMe alone once
	// the memory slots moved on) leaves the index at once, while the
	// agents still delete its objects: the stores are waited for.
	for tier, st := range map[string]tiers.Store{"nvme": tc.storeOf(1, "nvme"), "pfs": tc.storeOf(0, "pfs"), "s3": tc.storeOf(0, "s3")} {
		perStep := 2*ws + 1 // shards, their leaf hashes and the manifest
		if tier == "nvme" {
			perStep = 2*(ws/2) + 1 // node-1's ranks
		}
		waitOnStore(t, st, job, want[tier], perStep)
	}
}

// TestCorruptManifestNotRediscovered: a manifest damaged on the parallel
// filesystem is skipped, with a log line naming it, by the agent listing
// the tier for a coordinator on an empty store: its step does not come
// back, and the tier's other copies do.
func TestCorruptManifestNotRediscovered(t *testing.T) {
	const job, policy = "rot", "pfs:every=1,keep=3"
	var logs testcluster.Logs
	tc := newTierCluster(t, 1, policy, func(_ int, cfg *agent.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	for step := int64(1); step <= 3; step++ { // memory keeps steps 2 and 3
		tc.saveStep(job, 1, step, 0)
		tc.waitLatest(job, step)
		tc.waitStarted(job, step, []string{"pfs"})
		tc.waitTiers(job)
	}
	for step, content := range map[int64]string{1: `{"job": "rot", "step": 1, "world_size": 1, "shards": [`, 2: `{"job":"rot","step":2,"world_size":1,"shards":[]}`} {
		name := filepath.Join(tc.pfs, filepath.FromSlash(tiers.ManifestName(job, step)))
		if err := os.WriteFile(name, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	tc.restartEmpty(policy, nil)
	tc.waitDurable(job, map[string][]int64{"pfs": {3}})
	wait.For(t, 10*time.Second, "the agent to finish listing its tiers", func() bool { return logs.Has("tier copies listed") })
	if _, err := tc.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: 1}); status.Code(err) != codes.NotFound {
		t.Fatalf("step 1, whose only copy has a corrupt manifest: %v, want not found", err)
	}
	st, err := tc.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: 2})
	if err != nil || len(st.Step.Copies) != 1 || st.Step.Copies[0].Tier != "shm" || len(st.Step.Tiers) != 0 {
		t.Fatalf("step 2, in memory and with an invalid manifest on pfs: %v %v", st, err)
	}
	out := logs.String()
	for _, step := range []int64{1, 2} {
		if !slices.ContainsFunc(strings.Split(out, "\n"), func(l string) bool {
			return strings.Contains(l, "manifest on tier skipped") && strings.Contains(l, fmt.Sprintf("job=%s step=%d ", job, step))
		}) {
			t.Fatalf("no log line names the skipped manifest of step %d:\n%s", step, out)
		}
	}
	if !strings.Contains(out, "skipped=2") {
		t.Fatalf("the listing's summary does not count the two skipped manifests:\n%s", out)
	}
}
