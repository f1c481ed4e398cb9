package coordinator_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/transport"
)

// cluster is a coordinator and several agents on loopback, each agent with
// its own node name, shm root, socket and TCP port.
type cluster struct {
	t       *testing.T
	dataDir string
	addr    string
	stop    func()
	api     coordpb.CoordinatorClient
	agents  []*testcluster.Agent
	clients []*sdk.Client
}

// startCoordinator starts a coordinator on addr with its store in
// dataDir, changed by mods, and returns its address and a stop function.
func startCoordinator(t *testing.T, dataDir, addr string, mods ...func(*coordinator.Config)) (string, func()) {
	t.Helper()
	_, got, stop := runCoordinator(t, dataDir, addr, mods...)
	return got, stop
}

// runCoordinator is startCoordinator, also returning the coordinator.
func runCoordinator(t *testing.T, dataDir, addr string, mods ...func(*coordinator.Config)) (*coordinator.Coordinator, string, func()) {
	t.Helper()
	cfg := testcluster.CoordinatorConfig(t)
	cfg.ListenAddr, cfg.DataDir = addr, dataDir
	cfg.Replicas = 0 // the replication tests ask for replicas
	for _, m := range mods {
		m(&cfg)
	}
	c := testcluster.StartCoordinator(t, cfg)
	return c.Coordinator, c.Addr, c.Stop
}

func newCluster(t *testing.T, nodes int) *cluster {
	cl := &cluster{t: t, dataDir: filepath.Join(t.TempDir(), "coord")}
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, "127.0.0.1:0")
	cl.dial()
	for i := range nodes {
		cl.addAgent(func(cfg *agent.Config) {
			cfg.Node, cfg.FailureDomain = fmt.Sprintf("node-%d", i), fmt.Sprintf("rack-%d", i%2)
		})
	}
	cl.waitOrderStreams()
	return cl
}

// waitOrderStreams waits until every agent of the cluster has its order
// stream open on the coordinator: until then the coordinator sends it no
// tier copy and picks it as no step's peer (a step replicated while a
// peer was not connected keeps fewer replicas).
func (cl *cluster) waitOrderStreams() {
	cl.t.Helper()
	want := len(cl.agents)
	wait.ForNil(cl.t, 10*time.Second, fmt.Sprintf("the order streams of the %d agents open", want), func() error {
		resp, err := cl.api.TierStatus(ctxT(cl.t), &coordpb.TierStatusRequest{})
		if err == nil && len(resp.Nodes) < want {
			err = fmt.Errorf("%d open", len(resp.Nodes))
		}
		return err
	})
}

// dial connects the cluster's client to its coordinator.
func (cl *cluster) dial() { cl.api = testcluster.DialCoordinator(cl.t, cl.addr) }

// addAgent starts an agent of the cluster, mod naming it.
func (cl *cluster) addAgent(mod func(*agent.Config)) {
	t := cl.t
	cfg := testcluster.AgentConfig(t)
	cfg.ListenAddr, cfg.CoordinatorAddr = "127.0.0.1:0", cl.addr
	cfg.Logger = testcluster.Discard()
	mod(&cfg)
	cl.agents = append(cl.agents, startAgent(t, cfg))
	cl.clients = append(cl.clients, testcluster.Dial(t, cfg.Socket))
}

// startAgent starts an agent whose advertised address is its real TCP port.
func startAgent(t *testing.T, cfg agent.Config) *testcluster.Agent {
	// The TCP port is known only once listening: reserve one first.
	l := testcluster.FreeAddr(t)
	cfg.ListenAddr, cfg.AdvertiseAddr = l, l
	return testcluster.StartAgent(t, cfg)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// saveStep saves step for every rank of job, rank r on node r%nodes.
func (cl *cluster) saveStep(job string, ws uint32, step int64, ranks ...uint32) {
	cl.t.Helper()
	for _, r := range ranks {
		s, err := cl.clients[int(r)%len(cl.clients)].Session(job, r, ws)
		if err != nil {
			cl.t.Fatal(err)
		}
		data := make([]byte, 4096)
		for i := range data {
			data[i] = byte(int64(i) + step + int64(r))
		}
		if err := s.Save(ctxT(cl.t), step, []sdk.Tensor{{Name: "w", DType: shm.U8, Shape: []int64{4096}, Data: data}}, nil); err != nil {
			cl.t.Fatal(err)
		}
		s.Close()
	}
}

// saveSteps saves steps 1 to last for ranks, each waited for until it is
// the job's latest consistent step.
func (cl *cluster) saveSteps(job string, ws uint32, last int64, ranks ...uint32) {
	cl.t.Helper()
	for step := int64(1); step <= last; step++ {
		cl.saveStep(job, ws, step, ranks...)
		cl.waitLatest(job, step)
	}
}

// waitLatest waits until the coordinator reports step as job's latest
// consistent step.
func (cl *cluster) waitLatest(job string, step int64) {
	cl.t.Helper()
	wait.ForNil(cl.t, 10*time.Second, fmt.Sprintf("step %d as the latest consistent step of %s", step, job), func() error {
		resp, err := cl.api.Latest(ctxT(cl.t), &coordpb.LatestRequest{Job: job})
		if err != nil {
			return err
		}
		if resp.Step != step {
			return fmt.Errorf("latest consistent step %d", resp.Step)
		}
		return nil
	})
}

func TestGlobalCommitAcrossNodes(t *testing.T) {
	cl := newCluster(t, 3)
	ctx := ctxT(t)
	cl.saveStep("llm", 4, 1, 0, 1, 2, 3)
	cl.waitLatest("llm", 1)
	// Step 2: three ranks of four; it stays partial and latest stays 1.
	cl.saveStep("llm", 4, 2, 0, 1, 2)
	wait.ForNil(t, 10*time.Second, "the coordinator to record three commits of step 2", func() error {
		st, err := cl.api.InspectStep(ctx, &coordpb.InspectStepRequest{Job: "llm", Step: 2})
		if err != nil {
			return err
		}
		if st.Step.RanksCommitted != 3 {
			return fmt.Errorf("step 2 %s, %d ranks committed", st.Step.State, st.Step.RanksCommitted)
		}
		return nil
	})
	st, err := cl.api.InspectStep(ctx, &coordpb.InspectStepRequest{Job: "llm", Step: 2})
	if err != nil || st.Step.State != coordpb.StepState_STEP_STATE_PARTIAL || st.Step.RanksCommitted != 3 {
		t.Fatalf("step 2 after three of four ranks: %v %v", st, err)
	}
	if l, err := cl.api.Latest(ctx, &coordpb.LatestRequest{Job: "llm"}); err != nil || l.Step != 1 {
		t.Fatalf("latest consistent step with step 2 partial: %v %v, want 1", l, err)
	}
	cl.saveStep("llm", 4, 2, 3)
	cl.waitLatest("llm", 2)
	// The SDK asks the same in one call, through its agent.
	s, _ := cl.clients[1].Session("llm", 1, 4)
	if step, ok, err := s.LatestConsistent(ctx); err != nil || !ok || step != 2 {
		t.Fatalf("SDK LatestConsistent = %d %v %v, want 2", step, ok, err)
	}
	// Rank 1 goes ahead to step 3 alone; Restore still gives the step every
	// rank has, so ranks never restore different steps.
	cl.saveStep("llm", 4, 3, 1)
	if got, err := s.Restore(ctx); err != nil || got.Step != 2 {
		t.Fatalf("Restore with rank 1 at step 3 and the job consistent at 2: %v, %v", got, err)
	}

	jobs, err := cl.api.ListJobs(ctx, &coordpb.ListJobsRequest{})
	if err != nil || len(jobs.Jobs) != 1 || jobs.Jobs[0].WorldSize != 4 || len(jobs.Jobs[0].Placement) != 4 {
		t.Fatalf("jobs: %v %v", jobs, err)
	}
	if p := jobs.Jobs[0].Placement; p[1] != "node-1" || p[3] != "node-0" {
		t.Fatalf("placement %v, want rank r on node-(r%%3)", p)
	}
	v, err := cl.api.VerifyStep(ctx, &coordpb.StepRequest{Job: "llm", Step: 2})
	if err != nil || !v.Ok || len(v.Checks) != 4 {
		t.Fatalf("verify step 2: %v %v", v, err)
	}
	plan, err := cl.api.PlanRestore(ctx, &coordpb.PlanRestoreRequest{Job: "llm", Step: -1, DryRun: true, RequestedBy: "test"})
	if err != nil || plan.Step != 2 || len(plan.Ranks) != 4 {
		t.Fatalf("restore plan: %v %v", plan, err)
	}
	for _, r := range plan.Ranks {
		if r.Sources[0].Node != r.TargetNode {
			t.Fatalf("rank %d restores first from %s, not its own node %s", r.Rank, r.Sources[0].Node, r.TargetNode)
		}
	}
	// The latest consistent step is not deleted without force.
	_, err = cl.api.DeleteStep(ctx, &coordpb.DeleteStepRequest{Job: "llm", Step: 2})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "latest consistent") {
		t.Fatalf("delete of the latest consistent step: %v", err)
	}
	// Rank 1's step 3 took the slot of its step 1: three copies are left.
	del, err := cl.api.DeleteStep(ctx, &coordpb.DeleteStepRequest{Job: "llm", Step: 1})
	if err != nil || del.CopiesDeleted != 3 {
		t.Fatalf("delete step 1: %v %v", del, err)
	}
	for _, c := range cl.clients {
		shards, _ := c.List(ctx, "llm")
		for _, s := range shards {
			if s.Step == 1 {
				t.Fatalf("step 1 still on an agent after delete: %+v", s)
			}
		}
	}
}

func TestCoordinatorRebuildsFromAgents(t *testing.T) {
	cl := newCluster(t, 2)
	cl.saveStep("job", 2, 5, 0, 1)
	cl.saveStep("job", 2, 6, 0, 1)
	cl.waitLatest("job", 6)
	// The coordinator dies and comes back on an empty store, same address.
	cl.stop()
	startCoordinator(t, filepath.Join(t.TempDir(), "empty"), cl.addr)
	cl.waitLatest("job", 6)
	steps, err := cl.api.ListSteps(ctxT(t), &coordpb.ListStepsRequest{Job: "job"})
	if err != nil || len(steps.Steps) != 2 || steps.Steps[0].State != coordpb.StepState_STEP_STATE_CONSISTENT {
		t.Fatalf("steps rebuilt from the agents: %v %v", steps, err)
	}
	// Saves go on and reach the new coordinator.
	cl.saveStep("job", 2, 7, 0, 1)
	cl.waitLatest("job", 7)
}

func TestUnknownJobAndBadRankRefused(t *testing.T) {
	cl := newCluster(t, 1)
	ctx := ctxT(t)
	x := testcluster.DialCoordinatorAs(t, cl.addr, transport.Identity{Role: transport.RoleNode, Name: "x"}) // reports need a node's certificate
	_, err := x.Report(ctx, &coordpb.ReportRequest{Node: "x", Shards: []*coordpb.ShardRecord{{Job: "nope", Step: 1, Rank: 0, WorldSize: 1, State: coordpb.CopyState_COPY_STATE_COMMITTED}}})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("report for an unknown job: %v", err)
	}
	if _, err := cl.api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "j", WorldSize: 2}); err != nil {
		t.Fatal(err)
	}
	_, err = x.Report(ctx, &coordpb.ReportRequest{Node: "x", Shards: []*coordpb.ShardRecord{{Job: "j", Step: 1, Rank: 2, WorldSize: 2, State: coordpb.CopyState_COPY_STATE_COMMITTED}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "rank 2 out of range") {
		t.Fatalf("report for rank 2 of 2: %v", err)
	}
	if _, err := cl.api.Latest(ctx, &coordpb.LatestRequest{Job: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("latest of an unknown job: %v", err)
	}
}
