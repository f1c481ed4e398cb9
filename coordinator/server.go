package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// server adapts the Coordinator to its gRPC service.
type server struct {
	coordpb.UnimplementedCoordinatorServer
	c *Coordinator
}

var _ coordpb.CoordinatorServer = (*server)(nil)

func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, ErrUnknownJob), errors.Is(err, ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, ErrRefused), errors.Is(err, ErrFenced):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrRebuilding):
		code = codes.Unavailable
	case errors.Is(err, ErrTooLarge):
		code = codes.ResourceExhausted
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return status.Error(code, err.Error())
}

func (s *server) Register(ctx context.Context, req *coordpb.RegisterRequest) (*coordpb.RegisterResponse, error) {
	n := req.GetNode()
	if err := shm.ValidateNode(n.GetName()); err != nil {
		return nil, toStatus(fmt.Errorf("%w: coordinator: register: %w", ErrInvalid, err))
	}
	told := make(map[string]int64, len(req.Pins))
	for _, p := range req.Pins {
		if t, ok := told[p.Job]; p.Step >= 0 && (!ok || p.Step > t) {
			told[p.Job] = p.Step
		}
	}
	claimed := map[string]bool{}
	for _, r := range req.Inventory {
		claimed[r.GetJob()] = true
	}
	if err := s.c.adoptEpochs(n.Name, req.Pins, claimed); err != nil {
		return nil, toStatus(err)
	}
	pins, err := s.c.Register(&NodeInfo{Name: n.Name, Addr: n.Addr, FailureDomain: n.FailureDomain, BudgetBytes: n.ShmBudgetBytes}, recordsOf(req.Inventory), told)
	if err != nil {
		return nil, toStatus(err)
	}
	if err := s.c.adoptEpochs(n.Name, req.Pins, claimed); err != nil { // jobs the inventory created
		return nil, toStatus(err)
	}
	return &coordpb.RegisterResponse{Incarnation: s.c.Incarnation(), Pins: pins}, nil
}

// RegisterJob checks the whole request before it changes anything: a
// refused request (a bad policy, replicas out of range, a world size over
// the limit) leaves the job as it was, or unregistered.
func (s *server) RegisterJob(ctx context.Context, req *coordpb.RegisterJobRequest) (*coordpb.RegisterJobResponse, error) {
	if req.Replicas != nil {
		if err := validateReplicas(req.Job, int(*req.Replicas)); err != nil {
			return nil, toStatus(err)
		}
	}
	if req.MinWorldSize != nil {
		if err := validateElastic(req.Job, *req.MinWorldSize, req.WorldSize); err != nil {
			return nil, toStatus(err)
		}
	}
	var policy *tiers.Policy // refused before the job is touched; none keeps the job's
	if req.Policy != "" {
		p, err := tiers.ParsePolicy(req.Policy)
		if err != nil {
			return nil, toStatus(fmt.Errorf("%w: coordinator: job %s: %w", ErrInvalid, req.Job, err))
		}
		policy = &p
	}
	var re bool
	_, err := s.c.apply(func(ch *Changes) error {
		var err error
		if j := s.c.state.Jobs[req.Job]; j != nil && req.Epoch != 0 && req.Epoch < j.epochOf() {
			return fmt.Errorf("%w: coordinator: job %s: a rank of epoch %d registers it; the job is at epoch %d (a recovery or restart replaced that gang)",
				ErrFenced, req.Job, req.Epoch, j.epochOf())
		}
		re, err = s.c.state.RegisterJob(req.Job, req.WorldSize, req.Placement, ch)
		return err
	})
	if err == nil && policy != nil {
		err = s.c.tiers.setPolicy(req.Job, *policy)
	}
	if err == nil && req.Replicas != nil {
		err = s.c.replication.setReplicas(req.Job, int(*req.Replicas))
	}
	if err == nil && req.MinWorldSize != nil {
		err = s.c.setElastic(req.Job, *req.MinWorldSize, req.WorldSize)
	}
	if err != nil {
		return nil, toStatus(err)
	}
	if re {
		s.c.log.Info("job re-registered with a new world size", "job", req.Job, "world_size", req.WorldSize)
		s.c.noteWorldSize(req.Job, req.WorldSize, fmt.Sprintf("registered at world size %d", req.WorldSize))
	}
	return &coordpb.RegisterJobResponse{WorldSize: req.WorldSize, Reregistered: re}, nil
}

func (s *server) Report(ctx context.Context, req *coordpb.ReportRequest) (*coordpb.ReportResponse, error) {
	start := time.Now()
	recs := reportRecords.get(req.Shards)
	res, err := s.c.report(req.Node, *recs)
	reportRecords.put(recs) // nothing holds them once the report is answered
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &coordpb.ReportResponse{Incarnation: s.c.Incarnation(), Pins: res.Pins}
	for _, k := range res.Consistent {
		resp.Consistent = append(resp.Consistent, &coordpb.Pin{Job: k.Job, Step: k.Step})
		s.c.metrics.consistent.Inc()
		s.c.log.Debug("step consistent", "job", k.Job, "step", k.Step)
	}
	if len(res.Consistent) > 0 {
		s.c.metrics.commitToConsis.Observe(time.Since(start).Seconds())
	}
	return resp, nil
}

func (s *server) ReportStream(stream coordpb.Coordinator_ReportStreamServer) error {
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		resp, err := s.Report(stream.Context(), req)
		if err != nil {
			st := status.Convert(err)
			resp = &coordpb.ReportResponse{Incarnation: s.c.Incarnation(), ErrorCode: int32(st.Code()), Error: st.Message()}
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func recordsOf(shards []*coordpb.ShardRecord) []Record {
	return appendRecords(make([]Record, 0, len(shards)), shards)
}

func appendRecords(out []Record, shards []*coordpb.ShardRecord) []Record {
	for _, r := range shards {
		out = append(out, Record{Job: r.Job, Step: r.Step, Rank: r.Rank, WorldSize: r.WorldSize, Node: r.Node,
			Size: r.SizeBytes, Sum: r.HeaderChecksum, State: copyStateOf(r.State), Epoch: r.Epoch})
	}
	return out
}

// recordPool reuses the record slices of reports: every agent reports
// every step, and a slice made for each report was a fifth of what the
// coordinator allocated under a burst (each allocation brings the next
// collection nearer).
type recordPool struct{ p sync.Pool }

var reportRecords recordPool

// maxPooledRecords bounds the slices kept: an inventory-sized report
// is not worth keeping.
const maxPooledRecords = 1024

func (rp *recordPool) get(shards []*coordpb.ShardRecord) *[]Record {
	recs, _ := rp.p.Get().(*[]Record)
	if recs == nil {
		recs = new([]Record)
	}
	*recs = appendRecords((*recs)[:0], shards)
	return recs
}

func (rp *recordPool) put(recs *[]Record) {
	if cap(*recs) > maxPooledRecords {
		return
	}
	clear(*recs) // holds no request's strings
	*recs = (*recs)[:0]
	rp.p.Put(recs)
}

func (s *server) Latest(ctx context.Context, req *coordpb.LatestRequest) (*coordpb.LatestResponse, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if err := s.c.rebuildingLocked(req.Job); err != nil {
		return nil, toStatus(err)
	}
	j := s.c.state.Jobs[req.Job]
	if j == nil {
		return nil, toStatus(fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, req.Job))
	}
	latest := j.answer(j.latestAnswer())
	resp := &coordpb.LatestResponse{Step: latest, WorldSize: j.WorldSize, Protected: min(j.Protected, latest), Epoch: j.epochOf(), EpochStep: j.epochStep()}
	if st := j.Steps[latest]; st != nil {
		resp.WorldSize = st.WorldSize
	}
	return resp, nil
}

// ListJobs lists the jobs, or the one asked for, by id (jobviews.go).
func (s *server) ListJobs(ctx context.Context, req *coordpb.ListJobsRequest) (*coordpb.ListJobsResponse, error) {
	resp, err := s.c.listJobs(req)
	return resp, toStatus(err)
}

// ListSteps lists a job's steps, oldest first (stepviews.go). The index
// is locked for one step at a time, to copy it (view.go): a listing of a
// large job does not hold up the others, and a step that goes meanwhile
// is left out.
func (s *server) ListSteps(ctx context.Context, req *coordpb.ListStepsRequest) (*coordpb.ListStepsResponse, error) {
	s.c.mu.Lock()
	if err := s.c.rebuildingLocked(req.Job); err != nil {
		s.c.mu.Unlock()
		return nil, toStatus(err)
	}
	j := s.c.state.Jobs[req.Job]
	if j == nil {
		s.c.mu.Unlock()
		return nil, toStatus(fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, req.Job))
	}
	steps := slices.Sorted(maps.Keys(j.Steps))
	s.c.mu.Unlock()
	resp, err := s.c.listSteps(ctx, req, steps)
	return resp, toStatus(err)
}

func copyProto(c *Copy) *coordpb.Copy {
	return &coordpb.Copy{Rank: c.Rank, Node: c.Node, Tier: c.Tier, SizeBytes: c.Size, HeaderChecksum: c.Sum, State: c.State.proto()}
}

func (s *server) InspectStep(ctx context.Context, req *coordpb.InspectStepRequest) (*coordpb.InspectStepResponse, error) {
	resp, err := s.c.inspectStep(ctx, req)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

func (s *server) VerifyStep(ctx context.Context, req *coordpb.StepRequest) (*coordpb.VerifyStepResponse, error) {
	resp, err := s.c.VerifyStep(ctx, req.Job, req.Step)
	return resp, toStatus(err)
}

func (s *server) PlanRestore(ctx context.Context, req *coordpb.PlanRestoreRequest) (*coordpb.PlanRestoreResponse, error) {
	who := req.RequestedBy
	if who == "" {
		who = "unknown"
	}
	if req.Restart {
		plan, err := s.c.RestartJob(ctx, req.Job, req.Step, who, req.Force, req.DryRun)
		if err != nil {
			return nil, toStatus(err)
		}
		return plan, nil
	}
	if !req.DryRun {
		plan, err := s.c.Restore(ctx, req.Job, req.Step, who)
		return plan, toStatus(err)
	}
	plan, err := s.c.PlanRestore(ctx, req.Job, req.Step)
	if err != nil {
		return nil, toStatus(err)
	}
	s.c.log.Info("restore plan", "job", req.Job, "step", plan.Step, "dry_run", req.DryRun, "requested_by", who, "ranks", len(plan.Ranks))
	return plan, nil
}

func (s *server) DeleteStep(ctx context.Context, req *coordpb.DeleteStepRequest) (*coordpb.DeleteStepResponse, error) {
	n, err := s.c.DeleteStep(ctx, req.Job, req.Step, req.Force)
	if err != nil {
		return nil, toStatus(err)
	}
	return &coordpb.DeleteStepResponse{CopiesDeleted: uint32(n)}, nil
}

func (s *server) RankSources(ctx context.Context, req *coordpb.RankSourcesRequest) (*coordpb.RankSourcesResponse, error) {
	resp, err := s.c.RankSources(ctx, req.Job, req.Step, req.Rank, req.Node)
	if err != nil {
		return nil, toStatus(err)
	}
	return resp, nil
}

func (s *server) SuspectTierCopy(ctx context.Context, req *coordpb.SuspectTierCopyRequest) (*coordpb.SuspectTierCopyResponse, error) {
	answer, err := s.c.SuspectTierCopy(req)
	if err != nil {
		return nil, toStatus(err)
	}
	return &coordpb.SuspectTierCopyResponse{Answer: answer}, nil
}

// proto returns the state as the coordinator's API shows it.
func (s StepState) proto() coordpb.StepState {
	switch s {
	case Partial:
		return coordpb.StepState_STEP_STATE_PARTIAL
	case Consistent:
		return coordpb.StepState_STEP_STATE_CONSISTENT
	case Abandoned:
		return coordpb.StepState_STEP_STATE_ABANDONED
	}
	return coordpb.StepState_STEP_STATE_UNSPECIFIED
}

// copyStateOf returns a reported state; one that is none of the copy
// states is refused by name when the report is applied.
func copyStateOf(s coordpb.CopyState) CopyState { return CopyState(s.Label()) }

// proto returns the state as the coordinator's API shows it.
func (s CopyState) proto() coordpb.CopyState {
	switch s {
	case CopyCommitted:
		return coordpb.CopyState_COPY_STATE_COMMITTED
	case CopyCorrupt:
		return coordpb.CopyState_COPY_STATE_CORRUPT
	case CopyDeleted:
		return coordpb.CopyState_COPY_STATE_DELETED
	}
	return coordpb.CopyState_COPY_STATE_UNSPECIFIED
}
