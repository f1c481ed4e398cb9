package coordinator

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"rewind.dev/rewind/api/coordpb"
)

// fuzzCall is one unary method of the coordinator's gRPC service: its
// request type and how to call the handler with one.
type fuzzCall struct {
	name string
	req  func() proto.Message
	call func(ctx context.Context, s *server, m proto.Message) error
}

// unary adapts a handler to fuzzCall.
func unary[Req proto.Message, Resp any](name string, newReq func() Req, h func(*server, context.Context, Req) (Resp, error)) fuzzCall {
	return fuzzCall{name: name, req: func() proto.Message { return newReq() },
		call: func(ctx context.Context, s *server, m proto.Message) error {
			_, err := h(s, ctx, m.(Req))
			return err
		}}
}

// fuzzCalls are every unary method of the Coordinator service (the
// streams, WatchJob, ReportStream and Transfers, carry the same requests
// through the same validation).
var fuzzCalls = []fuzzCall{
	unary("Register", func() *coordpb.RegisterRequest { return &coordpb.RegisterRequest{} }, (*server).Register),
	unary("RegisterJob", func() *coordpb.RegisterJobRequest { return &coordpb.RegisterJobRequest{} }, (*server).RegisterJob),
	unary("Report", func() *coordpb.ReportRequest { return &coordpb.ReportRequest{} }, (*server).Report),
	unary("Latest", func() *coordpb.LatestRequest { return &coordpb.LatestRequest{} }, (*server).Latest),
	unary("ListJobs", func() *coordpb.ListJobsRequest { return &coordpb.ListJobsRequest{} }, (*server).ListJobs),
	unary("ListSteps", func() *coordpb.ListStepsRequest { return &coordpb.ListStepsRequest{} }, (*server).ListSteps),
	unary("InspectStep", func() *coordpb.InspectStepRequest { return &coordpb.InspectStepRequest{} }, (*server).InspectStep),
	unary("VerifyStep", func() *coordpb.StepRequest { return &coordpb.StepRequest{} }, (*server).VerifyStep),
	unary("PlanRestore", func() *coordpb.PlanRestoreRequest { return &coordpb.PlanRestoreRequest{} }, (*server).PlanRestore),
	unary("DeleteStep", func() *coordpb.DeleteStepRequest { return &coordpb.DeleteStepRequest{} }, (*server).DeleteStep),
	unary("RankSources", func() *coordpb.RankSourcesRequest { return &coordpb.RankSourcesRequest{} }, (*server).RankSources),
	unary("SuspectTierCopy", func() *coordpb.SuspectTierCopyRequest { return &coordpb.SuspectTierCopyRequest{} }, (*server).SuspectTierCopy),
	unary("TierReport", func() *coordpb.TierReportRequest { return &coordpb.TierReportRequest{} }, (*server).TierReport),
	unary("TierStatus", func() *coordpb.TierStatusRequest { return &coordpb.TierStatusRequest{} }, (*server).TierStatus),
	unary("NodeDown", func() *coordpb.NodeDownRequest { return &coordpb.NodeDownRequest{} }, (*server).NodeDown),
	unary("Audit", func() *coordpb.AuditRequest { return &coordpb.AuditRequest{} }, (*server).Audit),
	unary("Nodes", func() *coordpb.NodesRequest { return &coordpb.NodesRequest{} }, (*server).Nodes),
}

// clearCodes are the codes a refused request may carry: each says what
// the caller did wrong or what is missing. Unknown (an error that is not
// a status) and Internal would leave the caller guessing.
var clearCodes = []codes.Code{codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition,
	codes.AlreadyExists, codes.OutOfRange, codes.ResourceExhausted, codes.Aborted, codes.Unavailable,
	codes.DeadlineExceeded, codes.Canceled, codes.PermissionDenied}

// FuzzCoordinatorRequests sends any request to any unary handler of a
// coordinator that holds a job with consistent steps. Whatever the bytes,
// the handler returns within its deadline without panicking, a refusal
// carries a clear status code, and a refused request changes nothing in
// the index (jobs, their world size, placement, steps and latest step,
// nodes).
func FuzzCoordinatorRequests(f *testing.F) {
	u32 := func(n uint32) *uint32 { return &n }
	seeds := map[string]proto.Message{
		"Register":    &coordpb.RegisterRequest{Node: &coordpb.Node{Name: "n3", Addr: "127.0.0.1:1"}},
		"RegisterJob": &coordpb.RegisterJobRequest{Job: "other", WorldSize: 3, Replicas: u32(1), Policy: "nvme:every=2,keep=1"},
		"Report": &coordpb.ReportRequest{Node: "n1", Shards: []*coordpb.ShardRecord{{Job: "keep", Step: 9, Rank: 0, WorldSize: 2,
			Node: "n1", SizeBytes: 64, HeaderChecksum: "00", State: coordpb.CopyState_COPY_STATE_COMMITTED}}},
		"Latest":      &coordpb.LatestRequest{Job: "keep"},
		"ListJobs":    &coordpb.ListJobsRequest{},
		"ListSteps":   &coordpb.ListStepsRequest{Job: "keep"},
		"InspectStep": &coordpb.InspectStepRequest{Job: "keep", Step: 2, View: coordpb.StepView_STEP_VIEW_COPIES},
		"VerifyStep":  &coordpb.StepRequest{Job: "keep", Step: 2},
		"PlanRestore": &coordpb.PlanRestoreRequest{Job: "keep", Step: 2, DryRun: true},
		"DeleteStep":  &coordpb.DeleteStepRequest{Job: "keep", Step: 1},
		"RankSources": &coordpb.RankSourcesRequest{Job: "keep", Step: 2, Rank: 1, Node: "n1"},
		"TierReport":  &coordpb.TierReportRequest{Node: "n1"},
		"SuspectTierCopy": &coordpb.SuspectTierCopyRequest{Node: "n1", Job: "keep", Step: 2, Rank: 1, Tier: "pfs",
			HeaderChecksum: "00", Problem: "fuzz"},
		"TierStatus": &coordpb.TierStatusRequest{},
		"NodeDown":   &coordpb.NodeDownRequest{Node: "n9", Reason: "fuzz"},
		"Audit":      &coordpb.AuditRequest{Job: "keep", Limit: 5},
		"Nodes":      &coordpb.NodesRequest{Names: []string{"n1", "n9"}},
	}
	for i, c := range fuzzCalls {
		b, err := proto.Marshal(seeds[c.name])
		if err != nil {
			f.Fatal(err)
		}
		f.Add(byte(i), b)
	}
	c := newTestCoordinator(f, filepath.Join(f.TempDir(), "store"))
	s := &server{c: c}
	seedJob(f, s)
	f.Fuzz(func(t *testing.T, method byte, body []byte) {
		fc := fuzzCalls[int(method)%len(fuzzCalls)]
		req := fc.req()
		if err := proto.Unmarshal(body, req); err != nil {
			return // not a request gRPC would deliver
		}
		before := indexPrint(c)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- fc.call(ctx, s, req) }()
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s(%v) did not return within 10 s (its deadline 5 s)", fc.name, req)
		}
		if err == nil {
			return
		}
		st, ok := status.FromError(err)
		if !ok || !slices.Contains(clearCodes, st.Code()) {
			t.Fatalf("%s(%v) refused with %v (code %v): not a clear status", fc.name, req, err, status.Code(err))
		}
		if after := indexPrint(c); after != before {
			t.Fatalf("%s(%v) was refused (%v) but changed the index:\nbefore %s\nafter  %s", fc.name, req, err, before, after)
		}
	})
}

// seedJob registers two nodes and job "keep" (2 ranks) and commits steps
// 1 to 3 on both ranks.
func seedJob(tb testing.TB, s *server) {
	ctx := context.Background()
	for _, n := range []string{"n1", "n2"} {
		if _, err := s.Register(ctx, &coordpb.RegisterRequest{Node: &coordpb.Node{Name: n, Addr: "127.0.0.1:1"}}); err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := s.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "keep", WorldSize: 2,
		Placement: map[uint32]string{0: "n1", 1: "n2"}}); err != nil {
		tb.Fatal(err)
	}
	for step := int64(1); step <= 3; step++ {
		for r, n := range []string{"n1", "n2"} {
			if _, err := s.Report(ctx, &coordpb.ReportRequest{Node: n, Shards: []*coordpb.ShardRecord{{Job: "keep", Step: step,
				Rank: uint32(r), WorldSize: 2, Node: n, SizeBytes: 64, HeaderChecksum: "00",
				State: coordpb.CopyState_COPY_STATE_COMMITTED}}}); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if res, err := s.Latest(ctx, &coordpb.LatestRequest{Job: "keep"}); err != nil || res.Step != 3 {
		tb.Fatalf("seeded job: Latest = %v, %v; want 3", res, err)
	}
}

// indexPrint is what the index holds, in words: jobs (world size,
// placement, latest, steps with their copies) and nodes.
func indexPrint(c *Coordinator) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, id := range slices.Sorted(maps.Keys(c.state.Jobs)) {
		j := c.state.Jobs[id]
		fmt.Fprintf(&b, "job %s world %d latest %d placement %v steps", id, j.WorldSize, j.Latest, j.Placement)
		for _, st := range slices.Sorted(maps.Keys(j.Steps)) {
			fmt.Fprintf(&b, " %d(%v)", st, j.Steps[st].State)
			for _, r := range slices.Sorted(maps.Keys(j.Steps[st].Copies)) {
				for _, cp := range j.Steps[st].Copies[r] {
					fmt.Fprintf(&b, " r%d@%s/%s:%v", r, cp.Node, cp.Tier, cp.State)
				}
			}
		}
		b.WriteString("; ")
	}
	fmt.Fprintf(&b, "nodes %v", slices.Sorted(maps.Keys(c.state.Nodes)))
	return b.String()
}
