package coordinator_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/agenttest"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// cluster is a coordinator and several agents on loopback, each agent with
// its own node name, shm root, socket and TCP port.
type cluster struct {
	t       *testing.T
	dataDir string
	addr    string
	stop    func()
	api     coordpb.CoordinatorClient
	agents  []*agenttest.Running
	clients []*sdk.Client
}

func startCoordinator(t *testing.T, dataDir, addr string, mods ...func(*coordinator.Config)) (string, func()) {
	t.Helper()
	_, got, stop := runCoordinator(t, dataDir, addr, mods...)
	return got, stop
}

// runCoordinator is startCoordinator, also returning the coordinator.
func runCoordinator(t *testing.T, dataDir, addr string, mods ...func(*coordinator.Config)) (*coordinator.Coordinator, string, func()) {
	t.Helper()
	cfg := coordinator.DefaultConfig()
	cfg.ListenAddr, cfg.MetricsAddr, cfg.DataDir = addr, "", dataDir
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Replicas = 0 // the replication tests ask for replicas
	for _, m := range mods {
		m(&cfg)
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan struct{})
	go func() { c.Run(ctx, func(a, _ string) { ready <- a }); close(done) }()
	got := <-ready
	var stopped bool
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
			c.Close()
		}
	}
	t.Cleanup(stop)
	return c, got, stop
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
	return cl
}

// dial connects the cluster's client to its coordinator.
func (cl *cluster) dial() {
	conn, err := grpc.NewClient(cl.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { conn.Close() })
	cl.api = coordpb.NewCoordinatorClient(conn)
}

// addAgent starts an agent of the cluster, mod naming it.
func (cl *cluster) addAgent(mod func(*agent.Config)) {
	t := cl.t
	cfg := agenttest.Config(t)
	cfg.ListenAddr, cfg.CoordinatorAddr = "127.0.0.1:0", cl.addr
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	mod(&cfg)
	cl.agents = append(cl.agents, startAgent(t, cfg))
	c, err := sdk.Dial(context.Background(), cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl.clients = append(cl.clients, c)
}

// startAgent starts an agent whose advertised address is its real TCP port.
func startAgent(t *testing.T, cfg agent.Config) *agenttest.Running {
	// The TCP port is known only once listening: reserve one first.
	l := agenttest.FreePort(t)
	cfg.ListenAddr, cfg.AdvertiseAddr = l, l
	return agenttest.Start(t, cfg)
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
	deadline := time.Now().Add(10 * time.Second)
	var last int64 = -2
	for time.Now().Before(deadline) {
		resp, err := cl.api.Latest(ctxT(cl.t), &coordpb.LatestRequest{Job: job})
		if err == nil {
			last = resp.Step
			if resp.Step == step {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	cl.t.Fatalf("latest consistent step of %s is %d, want %d", job, last, step)
}

func TestGlobalCommitAcrossNodes(t *testing.T) {
	cl := newCluster(t, 3)
	ctx := ctxT(t)
	cl.saveStep("llm", 4, 1, 0, 1, 2, 3)
	cl.waitLatest("llm", 1)
	// Step 2: three ranks of four; it stays partial and latest stays 1.
	cl.saveStep("llm", 4, 2, 0, 1, 2)
	time.Sleep(100 * time.Millisecond)
	cl.waitLatest("llm", 1)
	st, err := cl.api.InspectStep(ctx, &coordpb.StepRequest{Job: "llm", Step: 2})
	if err != nil || st.Step.State != "partial" || st.Step.RanksCommitted != 3 {
		t.Fatalf("step 2 after three of four ranks: %v %v", st, err)
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
	if err != nil || len(steps.Steps) != 2 || steps.Steps[0].State != "consistent" {
		t.Fatalf("steps rebuilt from the agents: %v %v", steps, err)
	}
	// Saves go on and reach the new coordinator.
	cl.saveStep("job", 2, 7, 0, 1)
	cl.waitLatest("job", 7)
}

func TestUnknownJobAndBadRankRefused(t *testing.T) {
	cl := newCluster(t, 1)
	ctx := ctxT(t)
	_, err := cl.api.Report(ctx, &coordpb.ReportRequest{Node: "x", Shards: []*coordpb.ShardRecord{{Job: "nope", Step: 1, Rank: 0, WorldSize: 1, State: "committed"}}})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("report for an unknown job: %v", err)
	}
	if _, err := cl.api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "j", WorldSize: 2}); err != nil {
		t.Fatal(err)
	}
	_, err = cl.api.Report(ctx, &coordpb.ReportRequest{Node: "x", Shards: []*coordpb.ShardRecord{{Job: "j", Step: 1, Rank: 2, WorldSize: 2, State: "committed"}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "rank 2 out of range") {
		t.Fatalf("report for rank 2 of 2: %v", err)
	}
	if _, err := cl.api.Latest(ctx, &coordpb.LatestRequest{Job: "nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("latest of an unknown job: %v", err)
	}
}
