package coordinator_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/miniotest"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/tiers"
)

// tierCluster is a coordinator and agents with durable tiers: a local NVMe
// directory per node, one shared directory as the parallel filesystem, and
// a real MinIO as the object store.
type tierCluster struct {
	*cluster
	minio   *miniotest.Server
	nvme    []string // per node
	pfs     string
	cfgs    []agent.Config
	storeOf func(node int, tier string) tiers.Store
}

func newTierCluster(t *testing.T, nodes int, policy string, mod func(node int, cfg *agent.Config), coordMods ...func(*coordinator.Config)) *tierCluster {
	p, err := tiers.ParsePolicy(policy)
	if err != nil {
		t.Fatal(err)
	}
	tc := &tierCluster{cluster: &cluster{t: t, dataDir: filepath.Join(t.TempDir(), "coord")}, minio: miniotest.Start(t),
		pfs: filepath.Join(t.TempDir(), "pfs")}
	tc.addr, tc.stop = startCoordinator(t, tc.dataDir, "127.0.0.1:0", append([]func(*coordinator.Config){func(c *coordinator.Config) { c.Policy = p }}, coordMods...)...)
	tc.dial()
	tc.storeOf = func(node int, tier string) tiers.Store {
		var st tiers.Store
		var err error
		switch tier {
		case "nvme":
			st, err = tiers.NewFileStore(tc.nvme[node], tiers.NVMeOptions())
		case "pfs":
			st, err = tiers.NewFileStore(tc.pfs, tiers.PFSOptions())
		case "s3":
			st, err = s3StoreOn(tc.minio, func(cfg *tiers.S3Config) {
				cfg.PartSize, cfg.RetryBase, cfg.RetryMax, cfg.MaxAttempts = 5<<20, 50*time.Millisecond, 200*time.Millisecond, 3
			})
		}
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	for i := range nodes {
		tc.nvme = append(tc.nvme, filepath.Join(t.TempDir(), fmt.Sprintf("nvme-%d", i)))
		tc.addAgent(func(cfg *agent.Config) {
			cfg.Node = fmt.Sprintf("node-%d", i)
			cfg.Stores = map[tiers.Name]tiers.Store{"nvme": tc.storeOf(i, "nvme"), "pfs": tc.storeOf(i, "pfs"), "s3": tc.storeOf(i, "s3")}
			cfg.TransferBackoff = 50 * time.Millisecond
			if mod != nil {
				mod(i, cfg)
			}
			tc.cfgs = append(tc.cfgs, *cfg)
		})
	}
	tc.waitOrderStreams()
	return tc
}

// s3StoreOn is a store on srv's bucket under "rewind/", its settings the
// defaults changed by edit, logging nowhere.
func s3StoreOn(srv *miniotest.Server, edit func(*tiers.S3Config)) (*tiers.S3Store, error) {
	cfg := tiers.DefaultS3Config()
	cfg.URL, cfg.Endpoint = "s3://"+srv.Bucket+"/rewind", srv.URL()
	cfg.AccessKey, cfg.SecretKey = tiers.Secret(srv.AccessKey), tiers.Secret(srv.SecretKey)
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if edit != nil {
		edit(&cfg)
	}
	return tiers.NewS3Store(cfg)
}

// saveByPolicy saves steps 1 to steps of every rank of job (world size
// ws, rank r on node r%nodes), each waited for until consistent, the
// copies policy makes due started and every copy settled.
func (tc *tierCluster) saveByPolicy(job string, ws uint32, policy string, steps int64) {
	tc.t.Helper()
	p, err := tiers.ParsePolicy(policy)
	if err != nil {
		tc.t.Fatal(err)
	}
	ranks := make([]uint32, ws)
	for r := range ranks {
		ranks[r] = uint32(r)
	}
	last := map[string]int64{}
	for step := int64(1); step <= steps; step++ {
		tc.saveStep(job, ws, step, ranks...)
		tc.waitLatest(job, step)
		var due []string
		for _, tp := range p.Tiers {
			if l, ok := last[string(tp.Tier)]; !ok || step-l >= tp.EverySteps {
				due, last[string(tp.Tier)] = append(due, string(tp.Tier)), step
			}
		}
		tc.waitStarted(job, step, due)
		tc.waitTiers(job)
	}
}

// rankData is what rank r saves at step: the cluster's saveStep bytes.
func rankData(step int64, r uint32) []byte {
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(int64(i) + step + int64(r))
	}
	return data
}

// tierStates returns job's tier copies: tier -> state -> steps.
func (tc *tierCluster) tierStates(job string) map[string]map[string][]int64 {
	tc.t.Helper()
	resp, err := tc.api.ListSteps(ctxT(tc.t), &coordpb.ListStepsRequest{Job: job})
	if err != nil {
		tc.t.Fatal(err)
	}
	out := map[string]map[string][]int64{}
	for _, st := range resp.Steps {
		for _, c := range st.Tiers {
			if out[c.Tier] == nil {
				out[c.Tier] = map[string][]int64{}
			}
			out[c.Tier][c.State.Label()] = append(out[c.Tier][c.State.Label()], st.Step)
		}
	}
	return out
}

// waitTiers waits until no tier copy of job is copying or deleting, and
// returns the durable steps per tier.
func (tc *tierCluster) waitTiers(job string) map[string][]int64 {
	tc.t.Helper()
	var durable map[string][]int64
	wait.ForNil(tc.t, 20*time.Second, "the tier copies of "+job+" to stop moving", func() error {
		s := tc.tierStates(job)
		busy := false
		durable = map[string][]int64{}
		for tier, states := range s {
			busy = busy || len(states["copying"]) > 0 || len(states["deleting"]) > 0
			durable[tier] = states["durable"]
		}
		if busy {
			return fmt.Errorf("tier copies %v", s)
		}
		return nil
	})
	return durable
}

// waitStarted waits until step of job has a copy, in any state, on each
// of the tiers named.
func (tc *tierCluster) waitStarted(job string, step int64, names []string) {
	tc.t.Helper()
	wait.ForNil(tc.t, 10*time.Second, fmt.Sprintf("step %d of %s to start on %v", step, job, names), func() error {
		s := tc.tierStates(job)
		for _, tier := range names {
			found := false
			for _, steps := range s[tier] {
				found = found || slices.Contains(steps, step)
			}
			if !found {
				return fmt.Errorf("not on %s: %v", tier, s)
			}
		}
		return nil
	})
}

// onStore lists the steps with a manifest, and every object, under job.
func onStore(t *testing.T, st tiers.Store, job string) ([]int64, []string) {
	t.Helper()
	steps, err := tiers.Steps(ctxT(t), st, job)
	if err != nil {
		t.Fatal(err)
	}
	names, err := st.List(ctxT(t), job+"/")
	if err != nil {
		t.Fatal(err)
	}
	return steps, names
}

// waitOnStore waits until the manifests on st under job are those of the
// steps want, and, with perStep above 0, st holds perStep objects (shards,
// their leaf hashes and the manifest) for each of them and nothing else
// under job. The index
// drops a tier copy the moment retention (or an operator) removes it, and
// with it a step that has no other copy, so ListSteps (waitTiers) stops
// showing the copy, deleting, while its agent is still deleting its
// objects: what the stores hold is waited for, not assumed.
func waitOnStore(t *testing.T, st tiers.Store, job string, want []int64, perStep int) {
	t.Helper()
	wait.ForNil(t, 10*time.Second, fmt.Sprintf("%s to hold the steps %v of %s", st, want, job), func() error {
		steps, names := onStore(t, st, job)
		if !slices.Equal(steps, want) || (perStep > 0 && len(names) != perStep*len(want)) {
			return fmt.Errorf("manifests for steps %v, %d objects: %v", steps, len(names), names)
		}
		return nil
	})
}

// TestTiersPolicyRetentionAndEachTierAlone: a job of four ranks on two
// nodes checkpoints twelve steps under a policy over all three tiers; the
// copies and retention follow the policy exactly, on the coordinator and
// on the stores; then shared memory is lost and each tier alone brings
// back the newest step it holds, bit-identical.
func TestTiersPolicyRetentionAndEachTierAlone(t *testing.T) {
	const job, ws = "tiered", 4
	policy := "nvme:every=2,keep=2;pfs:every=3,keep=1;s3:every=4,keep=2"
	tc := newTierCluster(t, 2, policy, nil)
	tc.saveByPolicy(job, ws, policy, 12)
	// nvme: 1,3,5,7,9,11 keep 2; pfs: 1,4,7,10 keep 1; s3: 1,5,9 keep 2.
	want := map[string][]int64{"nvme": {9, 11}, "pfs": {10}, "s3": {5, 9}}
	got := tc.waitTiers(job)
	for tier, steps := range want {
		if !slices.Equal(got[tier], steps) {
			t.Fatalf("durable copies on %s: %v, want %v (all: %v)", tier, got[tier], steps, tc.tierStates(job))
		}
	}
	stores := map[string][]tiers.Store{"nvme": {tc.storeOf(0, "nvme"), tc.storeOf(1, "nvme")}, "pfs": {tc.storeOf(0, "pfs")}, "s3": {tc.storeOf(0, "s3")}}
	for tier, sts := range stores {
		for _, st := range sts {
			perStep := 2*ws + 1 // shards, their leaf hashes and the manifest
			if tier == "nvme" {
				perStep = 2*(ws/2) + 1
			}
			waitOnStore(t, st, job, want[tier], perStep)
		}
	}
	// The restore plan of a step held only on tiers lists them.
	plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: 10, DryRun: true})
	if err != nil || len(plan.Ranks) != ws || plan.Ranks[0].Sources[0].Tier != "pfs" {
		t.Fatalf("plan of step 10 (on pfs only): %v %v", plan, err)
	}

	// The nodes lose their shared memory; each tier alone restores.
	for _, a := range tc.agents {
		a.Stop()
	}
	tc.stop()
	for tier, newest := range map[string]int64{"nvme": 11, "pfs": 10, "s3": 9} {
		for node := range 2 {
			cfg := testcluster.AgentConfig(t) // a fresh, empty shm root
			cfg.Node, cfg.Logger = fmt.Sprintf("node-%d", node), slog.New(slog.NewTextHandler(io.Discard, nil))
			cfg.Stores = map[tiers.Name]tiers.Store{tiers.Name(tier): tc.storeOf(node, tier)}
			r := testcluster.StartAgent(t, cfg)
			c := testcluster.Dial(t, cfg.Socket)
			for rank := uint32(node); rank < ws; rank += 2 {
				res, err := r.Agent.Fetch(ctxT(t), job, rank, -1, nil)
				if err != nil || res.Step != newest || res.Tier != tier {
					t.Fatalf("fetch of rank %d from %s alone: %+v %v, want step %d", rank, tier, res, err, newest)
				}
				s, _ := c.Session(job, rank, ws)
				got, err := s.RestoreStep(ctxT(t), newest)
				if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(newest, rank)) {
					t.Fatalf("rank %d restored from %s: %v, bit-identical %v", rank, tier, err, err == nil && bytes.Equal(got.Tensors[0].Data, rankData(newest, rank)))
				}
			}
			c.Close()
			r.Stop()
		}
	}
}

// TestTierFetchFallsBackFromACorruptCopy: a byte flipped in the NVMe copy
// of a shard is caught on restore, which falls back to the next tier.
func TestTierFetchFallsBackFromACorruptCopy(t *testing.T) {
	const job = "flip"
	tc := newTierCluster(t, 1, "nvme:every=1,keep=2;pfs:every=1,keep=2", nil)
	tc.saveStep(job, 1, 1, 0)
	tc.waitLatest(job, 1)
	tc.waitStarted(job, 1, []string{"nvme", "pfs"})
	if got := tc.waitTiers(job); !slices.Equal(got["nvme"], []int64{1}) || !slices.Equal(got["pfs"], []int64{1}) {
		t.Fatalf("durable copies: %v", got)
	}
	path := filepath.Join(tc.nvme[0], filepath.FromSlash(tiers.ShardName(job, 1, 0)))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-100] ^= 0x01
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
	tc.agents[0].Stop()
	cfg := testcluster.AgentConfig(t) // memory lost
	cfg.Node, cfg.Stores = "node-0", tc.cfgs[0].Stores
	r := testcluster.StartAgent(t, cfg)
	res, err := r.Agent.Fetch(ctxT(t), job, 0, 1, nil)
	if err != nil || res.Tier != "pfs" || len(res.Failed) != 1 || res.Failed[0].Tier != "nvme" || !strings.Contains(res.Failed[0].Err.Error(), "corrupt") {
		t.Fatalf("fetch with a corrupt NVMe copy: %+v %v, want pfs after an nvme corruption", res, err)
	}
	c := testcluster.Dial(t, cfg.Socket)
	s, _ := c.Session(job, 0, 1)
	got, err := s.RestoreStep(ctxT(t), 1)
	if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(1, 0)) {
		t.Fatalf("restore after the fallback: %v", err)
	}
}

// TestTierCopiesSurviveCoordinatorRestart: the coordinator is restarted on
// its store; the durable tier copies are still listed and still restore
// sources, and retention goes on counting them.
func TestTierCopiesSurviveCoordinatorRestart(t *testing.T) {
	const job = "restart"
	tc := newTierCluster(t, 1, "pfs:every=1,keep=2", nil)
	for step := int64(1); step <= 2; step++ {
		tc.saveStep(job, 1, step, 0)
		tc.waitLatest(job, step)
		tc.waitStarted(job, step, []string{"pfs"})
		tc.waitTiers(job)
	}
	tc.stop()
	tc.addr, tc.stop = startCoordinator(t, tc.dataDir, tc.addr, func(c *coordinator.Config) {
		c.Policy, _ = tiers.ParsePolicy("pfs:every=1,keep=2")
	})
	// Verified at once, before the agent is back on its transfer stream:
	// the coordinator waits for an agent that has the tier to read the
	// copy back, rather than failing.
	v, err := tc.api.VerifyStep(ctxT(t), &coordpb.StepRequest{Job: job, Step: 2})
	if err != nil || !v.Ok || len(v.Checks) != 2 {
		t.Fatalf("verify of step 2 right after the restart: %v %v", v, err)
	}
	if got := tc.waitTiers(job); !slices.Equal(got["pfs"], []int64{1, 2}) {
		t.Fatalf("pfs copies after the restart: %v", got)
	}
	plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: 1, DryRun: true})
	if err != nil || len(plan.Ranks[0].Sources) != 2 || plan.Ranks[0].Sources[0].Tier != "shm" || plan.Ranks[0].Sources[1].Tier != "pfs" {
		t.Fatalf("plan of step 1 after the restart: %v %v", plan, err)
	}
	// Step 3 goes to pfs once the agent is back on its transfer stream;
	// retention then drops step 1.
	tc.saveStep(job, 1, 3, 0)
	tc.waitLatest(job, 3)
	tc.waitStarted(job, 3, []string{"pfs"})
	if got := tc.waitTiers(job); !slices.Equal(got["pfs"], []int64{2, 3}) {
		t.Fatalf("pfs copies after a step past the restart: %v", got)
	}
	// The index drops a copy before its agent deletes it from the store.
	wait.For(t, 10*time.Second, "the manifests on pfs are not those of steps 2 and 3", func() bool {
		steps, _ := onStore(t, tc.storeOf(0, "pfs"), job)
		return slices.Equal(steps, []int64{2, 3})
	})
}

// TestAllNodesLostRestoreFromObjectStore: every node of the job loses its
// memory and its disks; new agents come up under the same names, and an
// operator's restore brings the newest step back from the object store,
// bit-identical.
func TestAllNodesLostRestoreFromObjectStore(t *testing.T) {
	const job, ws = "lost-all", 2
	tc := newTierCluster(t, 2, "s3:every=1,keep=2", nil)
	for step := int64(1); step <= 3; step++ {
		tc.saveStep(job, ws, step, 0, 1)
		tc.waitLatest(job, step)
		tc.waitStarted(job, step, []string{"s3"})
		tc.waitTiers(job)
	}
	for _, a := range tc.agents {
		a.Stop()
	}
	s3 := tc.storeOf(0, "s3")
	var clients []*sdk.Client
	for i := range 2 {
		cfg := testcluster.AgentConfig(t) // new memory, no NVMe
		cfg.Node, cfg.CoordinatorAddr = fmt.Sprintf("node-%d", i), tc.addr
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg.Stores = map[tiers.Name]tiers.Store{"s3": s3}
		startAgent(t, cfg)
		c := testcluster.Dial(t, cfg.Socket)
		clients = append(clients, c)
	}
	// The new agents' empty inventories take the lost memory copies out
	// of the index.
	wait.ForNil(t, 10*time.Second, "a plan with one source per rank after every node lost its memory", func() error {
		plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, DryRun: true})
		if err == nil && (len(plan.Ranks[0].Sources) != 1 || len(plan.Ranks[1].Sources) != 1) {
			err = fmt.Errorf("plan %v", plan)
		}
		return err
	})
	plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, RequestedBy: "test"})
	if err != nil || !plan.Ok || plan.Step != 3 {
		t.Fatalf("restore from the object store: %v %v", plan, err)
	}
	for r := range uint32(ws) {
		if plan.Ranks[r].Used != "s3:-" {
			t.Fatalf("rank %d restored from %q, want the object store", r, plan.Ranks[r].Used)
		}
		s, _ := clients[r].Session(job, r, ws)
		got, err := s.RestoreStep(ctxT(t), 3)
		if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(3, r)) {
			t.Fatalf("rank %d after the restore from S3: %v", r, err)
		}
	}
}
