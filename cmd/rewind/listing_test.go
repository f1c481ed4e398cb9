package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// A job of the size rewind is for: 8,192 ranks, 8 a node, 6 steps, each
// rank's shard in its node's memory and in the next node's (2 copies).
const (
	bigRanks   = 8192
	bigPerNode = 8
	bigNodes   = bigRanks / bigPerNode
	bigSteps   = 6
	bigShard   = 1 << 30
	bigJob     = "big-job"
)

// bigNode names node i as a cluster's DNS names nodes.
func bigNode(i int) string { return fmt.Sprintf("gpu-%04d.train.cluster.local", i%bigNodes) }

// deleteCounter is an agent for every node of the test: it answers the
// coordinator's deletions and counts them by step.
type deleteCounter struct {
	agentpb.UnimplementedAgentServer
	mu    sync.Mutex
	calls map[int64]int
}

func (d *deleteCounter) Delete(ctx context.Context, req *agentpb.DeleteRequest) (*agentpb.DeleteResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls[req.Step]++
	return &agentpb.DeleteResponse{Deleted: 2 * bigPerNode}, nil
}

// startDeleteCounter serves a deleteCounter on loopback with the test
// nodes' certificate (it speaks for any node) until t ends.
func startDeleteCounter(t *testing.T) (*deleteCounter, string) {
	t.Helper()
	sec := testcluster.TLS(t, testcluster.NodeID)
	l, err := sec.Listen("agent", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if sec != nil {
		opts = append(opts, sec.ServerOption())
	}
	srv := grpc.NewServer(opts...)
	d := &deleteCounter{calls: map[int64]int{}}
	agentpb.RegisterAgentServer(srv, d)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return d, l.Addr().String()
}

// eachNode runs f for every node, 16 at a time, and fails t on the first
// error.
func eachNode(t *testing.T, f func(i int) error) {
	t.Helper()
	errs := make(chan error, bigNodes)
	next := make(chan int, bigNodes)
	for i := range bigNodes {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// startBigJob starts a coordinator and feeds it the big job as its agents
// would: each node registers, then reports its ranks' shards of every
// step and its replicas of the previous node's. It returns the
// coordinator's address and the agents' deletion counter.
func startBigJob(t *testing.T) (string, *deleteCounter) {
	t.Helper()
	ctx := t.Context()
	cfg := testcluster.CoordinatorConfig(t)
	cfg.Replicas = 0            // the nodes report the replicas themselves
	cfg.Policy = tiers.Policy{} // no tier copies to order
	addr := testcluster.StartCoordinator(t, cfg).Addr
	deletes, agentAddr := startDeleteCounter(t)
	op := testcluster.DialCoordinator(t, addr)
	placement := map[uint32]string{}
	for r := range uint32(bigRanks) {
		placement[r] = bigNode(int(r) / bigPerNode)
	}
	if _, err := op.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: bigJob, WorldSize: bigRanks, Placement: placement}); err != nil {
		t.Fatal(err)
	}
	api := testcluster.DialCoordinatorAs(t, addr, testcluster.NodeID)
	eachNode(t, func(i int) error {
		_, err := api.Register(ctx, &coordpb.RegisterRequest{Node: &coordpb.Node{Name: bigNode(i), Addr: agentAddr}})
		return err
	})
	eachNode(t, func(i int) error {
		req := &coordpb.ReportRequest{Node: bigNode(i)}
		for step := int64(1); step <= bigSteps; step++ {
			for _, owner := range []int{i, i + bigNodes - 1} { // its ranks, then its replicas of the previous node's
				for r := owner % bigNodes * bigPerNode; r < (owner%bigNodes+1)*bigPerNode; r++ {
					req.Shards = append(req.Shards, &coordpb.ShardRecord{Job: bigJob, Step: step, Rank: uint32(r), WorldSize: bigRanks,
						Node: bigNode(i), SizeBytes: bigShard, HeaderChecksum: shm.FormatSum(uint64(r) * 0x9e3779b97f4a7c15), State: coordpb.CopyState_COPY_STATE_COMMITTED})
				}
			}
		}
		_, err := api.Report(ctx, req)
		return err
	})
	return addr, deletes
}

// operator returns a runner of a command of rewind as the operator
// against the coordinator at addr: its output, the test failed on an
// error.
func operator(t *testing.T, addr string) func(cmd func(context.Context, []string) error, args ...string) string {
	t.Helper()
	if !testcluster.Plaintext() {
		t.Setenv(EnvTLSDir, testcluster.TLSDir(t, testcluster.OperatorID))
	}
	return func(cmd func(context.Context, []string) error, args ...string) string {
		t.Helper()
		out, err := capture(t, cmd, append([]string{"--coordinator=" + addr}, args...)...)
		if err != nil {
			t.Fatalf("rewind %v: %v\n%.2000s", args, err, out)
		}
		return out
	}
}

// TestLargeJobOperatorCommands: rewind ls JOB (a table and --json),
// rewind inspect JOB STEP and rewind delete of a step range work on a job
// of 8,192 ranks, 6 steps and 2 copies, and count its copies right. A
// listing of every copy of every step is 7 MB, over the 4 MiB one answer
// to a client holds.
func TestLargeJobOperatorCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("feeds a coordinator 98,304 copies")
	}
	addr, deletes := startBigJob(t)
	run := operator(t, addr)
	const copies, stepBytes = 2 * bigRanks, uint64(bigRanks * bigShard)

	// ls JOB: a line a step, every rank committed, the copies counted.
	out := run(runLs, bigJob)
	for step := 1; step <= bigSteps; step++ {
		want := fmt.Sprintf("%d consistent %d/%d %s shm×%d on %d nodes -", step, bigRanks, bigRanks, units.Bytes(2*stepBytes), copies, bigNodes)
		if !strings.Contains(normalSpace(out), want) {
			t.Fatalf("ls JOB lacks %q:\n%s", want, out)
		}
	}

	// ls JOB --json: each step's summary.
	var listed struct {
		Steps []struct {
			Step    int64 `json:"step"`
			Summary struct {
				Copies      int    `json:"copies"`
				Bytes       uint64 `json:"bytes"`
				StepBytes   uint64 `json:"step_bytes"`
				PlacesTotal int    `json:"places_total"`
				Places      []any  `json:"places"`
				Tiers       []struct {
					Tier   string `json:"tier"`
					Copies int    `json:"copies"`
					Nodes  int    `json:"nodes"`
				} `json:"tiers"`
			} `json:"summary"`
		} `json:"steps"`
	}
	if err := json.Unmarshal([]byte(run(runLs, bigJob, "--json")), &listed); err != nil || len(listed.Steps) != bigSteps {
		t.Fatalf("ls --json: %v, %d steps", err, len(listed.Steps))
	}
	for _, st := range listed.Steps {
		s := st.Summary
		if s.Copies != copies || s.Bytes != 2*stepBytes || s.StepBytes != stepBytes || s.PlacesTotal != bigNodes || len(s.Places) != 64 ||
			len(s.Tiers) != 1 || s.Tiers[0].Tier != "shm" || s.Tiers[0].Copies != copies || s.Tiers[0].Nodes != bigNodes {
			t.Fatalf("ls --json: step %d summary %+v", st.Step, s)
		}
	}

	// inspect JOB STEP: every copy, each rank on its node and the next.
	out = run(runInspect, bigJob, "3")
	if !strings.Contains(out, fmt.Sprintf("%d/%d ranks committed", bigRanks, bigRanks)) {
		t.Fatalf("inspect: no ranks committed line:\n%.2000s", out)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 7 && f[2] == "shm" && f[6] == "committed" {
			seen[f[0]+" "+f[1]] = true
		}
	}
	for r := range bigRanks {
		if !seen[fmt.Sprintf("%d %s", r, bigNode(r/bigPerNode))] || !seen[fmt.Sprintf("%d %s", r, bigNode(r/bigPerNode+1))] {
			t.Fatalf("inspect shows %d copies; rank %d's are not both there", len(seen), r)
		}
	}
	if len(seen) != copies {
		t.Fatalf("inspect shows %d copies, want %d", len(seen), copies)
	}

	var inspected struct {
		Step struct {
			Copies []struct{} `json:"copies"`
		} `json:"step"`
	}
	if err := json.Unmarshal([]byte(run(runInspect, bigJob, "3", "--json")), &inspected); err != nil || len(inspected.Step.Copies) != copies {
		t.Fatalf("inspect --json: %v, %d copies", err, len(inspected.Step.Copies))
	}

	// delete FIRST-LAST: the steps listed in the range (step 1: there
	// is no step 0), every copy, one call per node.
	out = run(runDelete, bigJob, "0-1")
	if want := fmt.Sprintf("deleted %d copies of job %s step 1\n", copies, bigJob); out != want {
		t.Fatalf("delete 0-1 printed %q, want %q", out, want)
	}
	deletes.mu.Lock()
	calls := fmt.Sprint(deletes.calls)
	deletes.mu.Unlock()
	if want := fmt.Sprint(map[int64]int{1: bigNodes}); calls != want {
		t.Errorf("agents were called %v times by step, want %v", calls, want)
	}
	if out := normalSpace(run(runLs, bigJob)); strings.Contains(out, "\n1 consistent") || !strings.Contains(out, "\n2 consistent") {
		t.Fatalf("ls after delete 0-1:\n%s", out)
	}

	// A client that asks for every copy of every step, as one before
	// views did, is told what to ask instead.
	_, err := testcluster.DialCoordinator(t, addr).ListSteps(t.Context(), &coordpb.ListStepsRequest{Job: bigJob})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "view summary") {
		t.Errorf("ListSteps of every copy: %v, want ResourceExhausted naming the views", err)
	}
}

// normalSpace makes each run of spaces in s one space.
func normalSpace(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

// TestManyLargeJobsListed: rewind ls, rewind ls JOB and rewind policy
// JOB work with 16 jobs of 8,192 ranks on 1,024 nodes registered, whose
// placements together (4.6 MB) are more than one answer to a client
// holds; a client that asks for them all, as one before views did, is
// told what to ask instead, and a node's supervisor still gets its job's
// placement.
func TestManyLargeJobsListed(t *testing.T) {
	const jobs = 16
	ctx := t.Context()
	addr := testcluster.StartCoordinator(t, testcluster.CoordinatorConfig(t)).Addr
	op := testcluster.DialCoordinator(t, addr)
	placement := map[uint32]string{}
	for r := range uint32(bigRanks) {
		placement[r] = bigNode(int(r) / bigPerNode)
	}
	job := func(i int) string { return fmt.Sprintf("big-job-%02d", i) }
	for i := range jobs {
		if _, err := op.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: job(i), WorldSize: bigRanks, Placement: placement}); err != nil {
			t.Fatal(err)
		}
	}
	run := operator(t, addr)

	out := normalSpace(run(runLs))
	for i := range jobs {
		if want := fmt.Sprintf("\n%s %d 1 - - 0", job(i), bigRanks); !strings.Contains(out, want) {
			t.Fatalf("ls lacks %q:\n%s", want, out)
		}
	}
	var listed struct {
		Jobs []map[string]any `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(run(runLs, "--json")), &listed); err != nil || len(listed.Jobs) != jobs {
		t.Fatalf("ls --json: %v, %d jobs", err, len(listed.Jobs))
	}
	for _, j := range listed.Jobs {
		if j["nodes"] != float64(bigNodes) || j["placement"] != nil {
			t.Fatalf("ls --json: job %v has nodes %v and placement of %T, want %d nodes and no placement", j["id"], j["nodes"], j["placement"], bigNodes)
		}
	}
	if out := run(runLs, job(3)); !strings.Contains(out, "STEP") {
		t.Fatalf("ls %s:\n%s", job(3), out)
	}
	if out, want := run(runPolicy, job(5)), job(5)+": "; !strings.HasPrefix(out, want) {
		t.Fatalf("policy %s printed %q, want %q…", job(5), out, want)
	}

	_, err := op.ListJobs(ctx, &coordpb.ListJobsRequest{})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "view summary") {
		t.Errorf("ListJobs with every placement: %v, want ResourceExhausted naming the view", err)
	}
	one, err := op.ListJobs(ctx, &coordpb.ListJobsRequest{Job: job(7)})
	if err != nil || len(one.Jobs) != 1 || one.Jobs[0].Id != job(7) || len(one.Jobs[0].Placement) != bigRanks || one.Jobs[0].Nodes != bigNodes {
		t.Fatalf("ListJobs of %s with its placement: %v, %v", job(7), err, one)
	}
	if none, err := op.ListJobs(ctx, &coordpb.ListJobsRequest{Job: "no-such-job"}); err != nil || len(none.Jobs) != 0 {
		t.Fatalf("ListJobs of an unknown job: %v, %v; want no jobs", err, none)
	}
}
