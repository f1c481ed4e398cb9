package coordinator

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/shm"
)

// longNode names node i with a name of shm.MaxNodeLen characters, the
// longest a node may have: a copy on it is some 290 bytes on the wire.
func longNode(i int) string {
	n := fmt.Sprintf("-%04d", i)
	return strings.Repeat("x", shm.MaxNodeLen-len(n)) + n
}

// fillJob registers job with world ranks and records, for each of steps
// and each rank, a committed copy on each of nodes(rank).
func fillJob(t testing.TB, c *Coordinator, job string, world uint32, steps []int64, nodes func(rank uint32) []string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.state.RegisterJob(job, world, nil, &Changes{}); err != nil {
		t.Fatal(err)
	}
	for _, step := range steps {
		for r := range world {
			for _, node := range nodes(r) {
				rec := Record{Job: job, Step: step, Rank: r, WorldSize: world, Node: node, Sum: fmt.Sprintf("%016x", uint64(r)*0x9e3779b97f4a7c15),
					Size: 1 << 30, State: CopyCommitted}
				if err := c.state.Apply(rec, &Changes{}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// dialDefault serves c's API on loopback and returns a client with
// gRPC's default limits: it takes answers of at most 4 MiB.
func dialDefault(t *testing.T, c *Coordinator) coordpb.CoordinatorClient {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coordpb.RegisterCoordinatorServer(srv, &server{c: c})
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return coordpb.NewCoordinatorClient(conn)
}

// wantTooLarge fails t unless err is the coordinator's refusal of an
// answer too large, naming the views to ask for (not a client's refusal
// of a message it was sent).
func wantTooLarge(t *testing.T, what string, err error) {
	t.Helper()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "view summary") {
		t.Errorf("%s: %v, want ResourceExhausted naming the views", what, err)
	}
}

// TestPagesOfLongNodeNames: with node names of 253 characters, pages at
// the largest page sizes (16,384 copies; 256 summaries of 64 places) are
// over the 4 MiB a client takes; each page comes cut to what it holds,
// whole ranks and whole steps, and paging shows every copy and every
// step once. An answer without a view, 16,384 such copies, is refused
// by the coordinator with the views named, not sent for the client to
// refuse.
func TestPagesOfLongNodeNames(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	defer c.Close()
	const ranks, nodes, steps = 8192, 64, maxStepsPage
	fillJob(t, c, "copies", ranks, []int64{1}, func(r uint32) []string {
		return []string{longNode(int(r) % nodes), longNode((int(r) + 1) % nodes)}
	})
	all := make([]int64, steps)
	for i := range all {
		all[i] = int64(i + 1)
	}
	fillJob(t, c, "steps", nodes, all, func(r uint32) []string { return []string{longNode(int(r))} })
	api := dialDefault(t, c)
	ctx := t.Context()

	t.Run("copies", func(t *testing.T) {
		seen := map[string]bool{}
		req := &coordpb.InspectStepRequest{Job: "copies", Step: 1, View: coordpb.StepView_STEP_VIEW_COPIES, PageSize: maxCopiesPage}
		for pages := 0; ; pages++ {
			resp, err := api.InspectStep(ctx, req)
			if err != nil {
				t.Fatalf("page %d from %q: %v", pages, req.PageToken, err)
			}
			cs := resp.Step.Copies
			if size := proto.Size(resp); size > pageBytes+2*300 {
				t.Errorf("page %d is %d bytes, over the page budget %d by more than a rank", pages, size, pageBytes)
			}
			if len(cs) == 0 || len(cs)%2 != 0 || cs[0].Rank != cs[1].Rank || cs[len(cs)-1].Rank != cs[len(cs)-2].Rank {
				t.Fatalf("page %d: %d copies, not whole ranks", pages, len(cs))
			}
			for _, cp := range cs {
				k := fmt.Sprint(cp.Rank, cp.Node)
				if seen[k] {
					t.Fatalf("rank %d's copy on node %.8s… is on two pages", cp.Rank, cp.Node)
				}
				seen[k] = true
			}
			if req.PageToken = resp.NextPageToken; req.PageToken == "" {
				if pages == 0 {
					t.Fatalf("one page of %d copies", len(seen))
				}
				break
			}
		}
		if len(seen) != 2*ranks {
			t.Fatalf("the pages show %d copies, want %d", len(seen), 2*ranks)
		}
	})
	t.Run("summaries", func(t *testing.T) {
		listed := map[int64]bool{}
		lreq := &coordpb.ListStepsRequest{Job: "steps", View: coordpb.StepView_STEP_VIEW_SUMMARY, PageSize: maxStepsPage}
		for pages := 0; ; pages++ {
			resp, err := api.ListSteps(ctx, lreq)
			if err != nil {
				t.Fatalf("listing page %d from %q: %v", pages, lreq.PageToken, err)
			}
			for _, st := range resp.Steps {
				if listed[st.Step] || len(st.Summary.GetPlaces()) != nodes {
					t.Fatalf("step %d listed twice, or with %d places", st.Step, len(st.Summary.GetPlaces()))
				}
				listed[st.Step] = true
			}
			if lreq.PageToken = resp.NextPageToken; lreq.PageToken == "" {
				if pages == 0 {
					t.Fatalf("one page of %d summaries", len(listed))
				}
				break
			}
		}
		if len(listed) != steps {
			t.Fatalf("the pages list %d steps, want %d", len(listed), steps)
		}
	})
	t.Run("without a view", func(t *testing.T) {
		_, err := api.InspectStep(ctx, &coordpb.InspectStepRequest{Job: "copies", Step: 1})
		wantTooLarge(t, "InspectStep without a view of 16,384 copies on long names", err)
		_, err = api.ListSteps(ctx, &coordpb.ListStepsRequest{Job: "steps"})
		wantTooLarge(t, "ListSteps without a view of 16,384 copies on long names", err)
	})
}

// TestAnswerWithoutViewHoldsWhatFits: a client that asks for every copy,
// as one before views did, gets them while they fit in what it takes:
// 40,000 copies on short node names are 2.8 MB. The coordinator counts an
// answer's size to the byte.
func TestAnswerWithoutViewHoldsWhatFits(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	defer c.Close()
	const ranks = 20000
	fillJob(t, c, "j", ranks, []int64{1}, func(r uint32) []string {
		return []string{fmt.Sprintf("gpu-%04d.train.cluster.local", r/8), fmt.Sprintf("gpu-%04d.train.cluster.local", r/8+1)}
	})
	api := dialDefault(t, c)
	ctx := t.Context()
	resp, err := api.InspectStep(ctx, &coordpb.InspectStepRequest{Job: "j", Step: 1})
	if err != nil || len(resp.Step.Copies) != 2*ranks {
		t.Fatalf("InspectStep without a view: %v, %d copies", err, len(resp.GetStep().GetCopies()))
	}
	list, err := api.ListSteps(ctx, &coordpb.ListStepsRequest{Job: "j"})
	if err != nil || len(list.Steps) != 1 || len(list.Steps[0].Copies) != 2*ranks {
		t.Fatalf("ListSteps without a view: %v, %v", err, list)
	}

	v, err := c.view(ctx, "j", 1, -1, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, size, err := c.fullStep(ctx, v, clientMaxAnswer)
	if err != nil {
		t.Fatal(err)
	}
	if want := proto.Size(&coordpb.InspectStepResponse{Step: st}); size != want {
		t.Fatalf("fullStep counts %d bytes, the answer is %d", size, want)
	}
	if _, _, err := c.fullStep(ctx, v, size); err != nil {
		t.Fatalf("fullStep within its own size: %v", err)
	}
	if _, _, err := c.fullStep(ctx, v, size-1); !errors.Is(err, errOverBudget) {
		t.Fatalf("fullStep a byte over: %v, want errOverBudget", err)
	}
}

// TestPageTokensBoundToTheirCall: a page token is taken only by the call
// that gave it (its job, its step, its kind of page).
func TestPageTokensBoundToTheirCall(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	defer c.Close()
	one := func(uint32) []string { return []string{"n1"} }
	fillJob(t, c, "a", 8, []int64{1, 2, 3}, one)
	fillJob(t, c, "b", 8, []int64{1, 2, 3}, one)
	s := &server{c: c}
	ctx := t.Context()
	copies := func(job string, step int64, tok string) (string, error) {
		resp, err := s.InspectStep(ctx, &coordpb.InspectStepRequest{Job: job, Step: step, View: coordpb.StepView_STEP_VIEW_COPIES, PageSize: 2, PageToken: tok})
		return resp.GetNextPageToken(), err
	}
	steps := func(job, tok string) (string, error) {
		resp, err := s.ListSteps(ctx, &coordpb.ListStepsRequest{Job: job, View: coordpb.StepView_STEP_VIEW_SUMMARY, PageSize: 1, PageToken: tok})
		return resp.GetNextPageToken(), err
	}
	rankTok, err := copies("a", 1, "")
	if err != nil || rankTok == "" {
		t.Fatalf("a first page of copies: %q, %v", rankTok, err)
	}
	stepTok, err := steps("a", "")
	if err != nil || stepTok == "" {
		t.Fatalf("a first page of steps: %q, %v", stepTok, err)
	}
	type testcase struct {
		call    func() (string, error)
		refused bool
	}
	run := func(t *testing.T, tc testcase) {
		_, err := tc.call()
		if got := status.Code(err) == codes.InvalidArgument; got != tc.refused {
			t.Fatalf("%v, refused %v, want %v", err, got, tc.refused)
		}
	}
	for name, tc := range map[string]testcase{
		"copies, same call":    {call: func() (string, error) { return copies("a", 1, rankTok) }},
		"copies, another step": {call: func() (string, error) { return copies("a", 2, rankTok) }, refused: true},
		"copies, another job":  {call: func() (string, error) { return copies("b", 1, rankTok) }, refused: true},
		"copies, a step token": {call: func() (string, error) { return copies("a", 1, stepTok) }, refused: true},
		"copies, no hash":      {call: func() (string, error) { return copies("a", 1, "rank/2") }, refused: true},
		"steps, same call":     {call: func() (string, error) { return steps("a", stepTok) }},
		"steps, another job":   {call: func() (string, error) { return steps("b", stepTok) }, refused: true},
		"steps, a rank token":  {call: func() (string, error) { return steps("a", rankTok) }, refused: true},
		"steps, garbage":       {call: func() (string, error) { return steps("a", "step/x") }, refused: true},
	} {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

// TestRankTooLargeForAnAnswer: a page holds at least one rank's copies,
// whatever their size; a rank whose copies alone are more than a client
// takes (1,201 copies of 4 KiB each, under a raised
// --max-copies-per-shard) is refused by name, not sent.
func TestRankTooLargeForAnAnswer(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	defer c.Close()
	const copies = 1200
	fillJob(t, c, "j", 3, []int64{1}, func(r uint32) []string { return []string{longNode(int(r))} })
	c.mu.Lock()
	c.state.limits.CopiesPerShard = copies + 1
	for i := range copies {
		rec := Record{Job: "j", Step: 1, Rank: 1, WorldSize: 3, Node: longNode(100 + i), Sum: strings.Repeat("f", 4096), Size: 1 << 30, State: CopyCommitted}
		if err := c.state.Apply(rec, &Changes{}); err != nil {
			c.mu.Unlock()
			t.Fatal(err)
		}
	}
	c.mu.Unlock()
	api := dialDefault(t, c)
	req := &coordpb.InspectStepRequest{Job: "j", Step: 1, View: coordpb.StepView_STEP_VIEW_COPIES}
	resp, err := api.InspectStep(t.Context(), req)
	if err != nil || len(resp.Step.Copies) != 1 || resp.NextPageToken == "" {
		t.Fatalf("first page: %v, %d copies, next %q; want rank 0's copy alone", err, len(resp.GetStep().GetCopies()), resp.GetNextPageToken())
	}
	req.PageToken = resp.NextPageToken
	_, err = api.InspectStep(t.Context(), req)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "rank 1's copies alone") {
		t.Fatalf("rank 1's page: %v, want ResourceExhausted naming rank 1", err)
	}
}
