package agent

import (
	"context"
	"fmt"
	"math"
	"os"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// server adapts the Agent to its gRPC service.
type server struct {
	agentpb.UnimplementedAgentServer
	a *Agent
}

func (s *server) Prepare(ctx context.Context, req *agentpb.PrepareRequest) (*agentpb.PrepareResponse, error) {
	if err := s.a.gang.check(req.Job, int64(req.Rank)); err != nil {
		return nil, err
	}
	if req.SizeBytes > maxShardBytes {
		return nil, fmt.Errorf("%w: agent: shard size %d bytes is too large", ErrInvalid, req.SizeBytes)
	}
	epoch, err := s.a.checkEpoch(req.Job, req.Rank, req.Epoch)
	if err != nil {
		return nil, err
	}
	res, err := s.a.PrepareAt(ctx, req.Job, req.Rank, req.WorldSize, req.Step, int64(req.SizeBytes), epoch)
	if err != nil {
		return nil, err
	}
	return &agentpb.PrepareResponse{Slot: res.Slot, Path: res.Path, SizeBytes: uint64(res.Size), Token: res.Token, Resized: res.Resized,
		Epoch: epoch, SegmentId: res.SegmentID}, nil
}

func (s *server) Commit(ctx context.Context, req *agentpb.CommitRequest) (*agentpb.CommitResponse, error) {
	if err := s.a.gang.check(req.Job, int64(req.Rank)); err != nil {
		return nil, err
	}
	seq, err := s.a.Commit(ctx, req.Job, req.Rank, req.Slot, req.Token, req.Step, req.HeaderChecksum)
	if err != nil {
		return nil, err
	}
	return &agentpb.CommitResponse{Step: req.Step, Seq: seq}, nil
}

func (s *server) Open(ctx context.Context, req *agentpb.OpenRequest) (*agentpb.OpenResponse, error) {
	if req.Ranged && !req.Latest {
		return s.openRanged(ctx, req)
	}
	sh, lease, err := s.a.openOrPull(ctx, req.Job, req.Rank, req.Step, req.Latest)
	if err != nil {
		return nil, err
	}
	s.opened(req, sh)
	return &agentpb.OpenResponse{Shard: sh.proto(), Lease: lease, Leaves: sh.Leaves.proto()}, nil
}

// opened counts an Open as a rank's restore during a recovery: the rank's
// own, or a peer reader's whose rank the step does not have.
func (s *server) opened(req *agentpb.OpenRequest, sh *shardInfo) {
	switch {
	case !req.Peer: // a reader of another rank's shard does not restore that rank
		s.a.gang.opened(req.Job, req.Rank, sh.Step)
	case req.ReaderRank != nil && *req.ReaderRank >= sh.WorldSize:
		// A rank of a gang grown past the step's world size: reading the
		// step is its restore, having no shard of its own in it.
		s.a.gang.opened(req.Job, *req.ReaderRank, sh.Step)
	}
}

// openRanged is Open for a caller that reads parts of the shard (a
// restore at another world size).
func (s *server) openRanged(ctx context.Context, req *agentpb.OpenRequest) (*agentpb.OpenResponse, error) {
	sh, leaves, lease, partial, err := s.a.openRanged(ctx, req.Job, req.Rank, req.Step)
	if err != nil {
		return nil, err
	}
	s.opened(req, sh)
	return &agentpb.OpenResponse{Shard: sh.proto(), Lease: lease, Leaves: leaves.proto(), Partial: partial}, nil
}

func (s *server) Fill(ctx context.Context, req *agentpb.FillRequest) (*agentpb.FillResponse, error) {
	ranges := make([][2]int64, len(req.Ranges))
	for i, r := range req.Ranges {
		if r.Offset > math.MaxInt64/2 || r.Length > math.MaxInt64/2 {
			return nil, fmt.Errorf("%w: agent: range of %d bytes at %d", ErrInvalid, r.Length, r.Offset)
		}
		ranges[i] = [2]int64{int64(r.Offset), int64(r.Length)}
	}
	n, node, err := s.a.Fill(ctx, req.Lease, ranges)
	if err != nil {
		return nil, err
	}
	return &agentpb.FillResponse{FetchedBytes: uint64(n), Node: node}, nil
}

func (s *server) Release(ctx context.Context, req *agentpb.ReleaseRequest) (*agentpb.ReleaseResponse, error) {
	s.a.Release(req.Lease)
	return &agentpb.ReleaseResponse{}, nil
}

func (s *server) List(ctx context.Context, req *agentpb.ListRequest) (*agentpb.ListResponse, error) {
	if req.Job != "" {
		if err := validateRank(req.Job, 0, 0); err != nil {
			return nil, err
		}
	}
	resp := &agentpb.ListResponse{}
	for _, sh := range s.a.List(req.Job) {
		resp.Shards = append(resp.Shards, sh.proto())
	}
	return resp, nil
}

func (s *server) Verify(ctx context.Context, req *agentpb.VerifyRequest) (*agentpb.VerifyResponse, error) {
	if req.Tier != "" {
		n, err := s.a.VerifyTier(ctx, tiers.Name(req.Tier), req.Job, req.Rank, req.Step)
		if err != nil {
			if isCorrupt(err) {
				return &agentpb.VerifyResponse{Ok: false, Problem: err.Error()}, nil
			}
			return nil, err
		}
		return &agentpb.VerifyResponse{Ok: true, BytesChecked: uint64(n)}, nil
	}
	return s.verify(req, "")
}

func (s *server) ReportCorrupt(ctx context.Context, req *agentpb.VerifyRequest) (*agentpb.VerifyResponse, error) {
	detail := req.Detail
	if detail == "" {
		detail = "(no detail given)"
	}
	return s.verify(req, detail)
}

// verify answers a corrupt shard with ok=false rather than an error: the
// call itself succeeded.
func (s *server) verify(req *agentpb.VerifyRequest, detail string) (*agentpb.VerifyResponse, error) {
	n, err := s.a.Verify(req.Job, req.Rank, req.Step, detail)
	if err != nil {
		if isCorrupt(err) {
			return &agentpb.VerifyResponse{Ok: false, Problem: err.Error()}, nil
		}
		return nil, err
	}
	return &agentpb.VerifyResponse{Ok: true, BytesChecked: uint64(n)}, nil
}

func (s *server) Delete(ctx context.Context, req *agentpb.DeleteRequest) (*agentpb.DeleteResponse, error) {
	n, freed, err := s.a.Delete(req.Job, req.Rank, req.AllRanks, req.Step)
	if err != nil {
		return nil, err
	}
	return &agentpb.DeleteResponse{Deleted: uint32(n), BytesFreed: uint64(freed)}, nil
}

func (s *server) Status(ctx context.Context, req *agentpb.StatusRequest) (*agentpb.StatusResponse, error) {
	st, err := s.a.cfg.FS.Statfs(s.a.cfg.ShmRoot)
	if err != nil {
		return nil, err
	}
	used, budget := s.a.Used()
	return &agentpb.StatusResponse{
		Node: s.a.cfg.Node, ShmRoot: s.a.cfg.ShmRoot, Filesystem: st.Type,
		FsSizeBytes: st.Size, FsFreeBytes: st.Free, BudgetBytes: budget, UsedBytes: used,
		SlotsPerRank: uint32(s.a.cfg.SlotsPerRank), Version: Version, Tiers: tierStrings(tierOrder(s.a.cfg.Stores)),
	}, nil
}

// Fetch restores a shard from the agent's tiers into shared memory.
func (s *server) Fetch(ctx context.Context, req *agentpb.FetchRequest) (*agentpb.FetchResponse, error) {
	var res FetchResult
	var err error
	if len(req.Sources) > 0 {
		srcs := make([]Source, len(req.Sources))
		for i, x := range req.Sources {
			srcs[i] = Source{Tier: x.Tier, Node: x.Node, Addr: x.Addr}
		}
		if err := s.a.checkFetchPeers(ctx, srcs); err != nil {
			return nil, err
		}
		res, err = s.a.FetchFrom(ctx, PeerShard{Job: req.Job, Rank: req.Rank, WorldSize: req.WorldSize, Step: req.Step,
			Size: int64(req.SizeBytes), HeaderSum: req.HeaderChecksum, Stage: req.Stage}, srcs)
	} else {
		res, err = s.a.Fetch(ctx, req.Job, req.Rank, req.Step, tierNames(req.Tiers))
	}
	// A staged fetch that no source served answers with every attempt
	// and why, for the coordinator to mark the copies and the step.
	exhausted := req.Stage != "" && len(req.Sources) > 0 && len(res.Failed) > 0 && ctx.Err() == nil
	if err != nil && !exhausted {
		return nil, err // it names every source that failed, and why
	}
	resp := &agentpb.FetchResponse{Step: res.Step, Tier: res.Tier, SizeBytes: uint64(res.Size), Staged: res.Staged}
	for _, f := range res.Failed {
		resp.Failed = append(resp.Failed, &agentpb.FetchAttempt{Tier: f.Tier, Error: f.Err.Error(), Failure: fetchFailure(f.Err)})
	}
	return resp, nil
}

// FinishRestore commits or frees the shards staged for a restore.
func (s *server) FinishRestore(ctx context.Context, req *agentpb.FinishRestoreRequest) (*agentpb.FinishRestoreResponse, error) {
	n, err := s.a.FinishRestore(req.Job, req.Stage, req.Commit)
	if err != nil {
		return nil, err
	}
	return &agentpb.FinishRestoreResponse{Shards: uint32(n)}, nil
}

// readChunk is the size of one streamed chunk: large enough to amortize
// per-message cost, well under gRPC's 4 MiB default message limit.
const readChunk = 1 << 20

// Read streams a committed shard. The shard is verified first, so a reader
// never receives bytes that do not match their checksums; the slot is pinned
// for the whole stream (no TTL) so a save cannot reuse or shrink it under
// the mapping.
func (s *server) Read(req *agentpb.ReadRequest, stream agentpb.Agent_ReadServer) error {
	sh, release, err := s.a.pin(req.Job, req.Rank, req.Step)
	if err != nil {
		return err
	}
	defer release()
	f, err := s.a.cfg.FS.OpenFile(sh.Path, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	m, err := shm.Map(f, sh.Size, false)
	if err != nil {
		return err
	}
	defer m.Close()
	for off := int64(0); off < sh.Size; off += readChunk {
		end := min(off+readChunk, sh.Size)
		chunk := &agentpb.ReadChunk{Offset: uint64(off), Data: m.Data[off:end]}
		if off == 0 {
			chunk.Shard = sh.proto()
		}
		if err := stream.Send(chunk); err != nil {
			return err
		}
		s.a.metrics.readBytes.Add(float64(end - off))
	}
	return nil
}

func (sh *shardInfo) proto() *agentpb.Shard {
	p := &agentpb.Shard{
		Job: sh.Job, Rank: sh.Rank, WorldSize: sh.WorldSize, Step: sh.Step, Slot: sh.Slot, Path: sh.Path,
		SizeBytes: uint64(sh.Size), State: sh.State.proto(), Seq: sh.Seq, HeaderChecksum: sh.HeaderSum,
		Verified: sh.Verified, Tensors: sh.Tensors, Problem: sh.Problem,
	}
	if !sh.CommittedAt.IsZero() && sh.CommittedAt.UnixNano() > 0 {
		p.CommittedUnixNano = sh.CommittedAt.UnixNano()
	}
	return p
}

var _ agentpb.AgentServer = (*server)(nil)

// CoordinatorUnreachable starts the message of an Unavailable error that
// comes from the coordinator behind a live agent, so clients can tell it
// from an agent that does not answer.
const CoordinatorUnreachable = "agent: coordinator"

// Consistent forwards to the coordinator: the job-wide answer is its.
func (s *server) Consistent(ctx context.Context, req *agentpb.ConsistentRequest) (*agentpb.ConsistentResponse, error) {
	if err := validateRank(req.Job, 0, 0); err != nil {
		return nil, err
	}
	if err := s.a.gang.check(req.Job, -1); err != nil {
		return nil, err
	}
	if s.a.rep == nil {
		return nil, fmt.Errorf("%w: started with no --coordinator, it knows no job-wide consistent step", ErrNoCoordinator)
	}
	asked := s.a.rep.ask()
	resp, err := s.a.rep.c.Latest(ctx, &coordpb.LatestRequest{Job: req.Job})
	if err != nil {
		st := status.Convert(err)
		if st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded {
			return nil, status.Errorf(codes.Unavailable, "%s %s unreachable: %s", CoordinatorUnreachable, s.a.cfg.CoordinatorAddr, st.Message())
		}
		return nil, err
	}
	// The answer carries the job's pins: the slots they hold stay held
	// from now, not from the next report's answer.
	s.a.rep.setPins(asked, []*coordpb.Pin{{Job: req.Job, Step: resp.Step, Protected: resp.Protected}})
	return &agentpb.ConsistentResponse{Step: resp.Step, WorldSize: resp.WorldSize}, nil
}
