package agent

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/transport"
)

// Job isolation on the SDK's sockets (Config.JobKeys). A call over the
// gRPC socket carries its job's token in the metadata key TokenMetadata;
// the job it acts on is read from the request, as the table socketJobs
// says for each method, and the token must be that job's. TCP callers are
// the transport's (certificates and roles): not checked here.

// TokenMetadata is the gRPC metadata key of the job token.
const TokenMetadata = "rewind-job-token"

// jobOf returns the job a call over the socket acts on, or an error when
// no rank may make it; "" is a call that touches no job's checkpoints.
type jobOf func(a *Agent, req any) (string, error)

// socketJobs maps every method of the Agent service to the job its
// request acts on. A method missing here is refused on the socket of an
// agent that isolates jobs (TestEveryMethodHasAJob keeps it whole).
var socketJobs = map[string]jobOf{
	agentpb.Agent_Prepare_FullMethodName:       func(_ *Agent, r any) (string, error) { return named(r.(*agentpb.PrepareRequest).Job) },
	agentpb.Agent_Commit_FullMethodName:        func(_ *Agent, r any) (string, error) { return named(r.(*agentpb.CommitRequest).Job) },
	agentpb.Agent_Open_FullMethodName:          func(_ *Agent, r any) (string, error) { return named(r.(*agentpb.OpenRequest).Job) },
	agentpb.Agent_Read_FullMethodName:          func(_ *Agent, r any) (string, error) { return named(r.(*agentpb.ReadRequest).Job) },
	agentpb.Agent_Verify_FullMethodName:        func(_ *Agent, r any) (string, error) { return named(r.(*agentpb.VerifyRequest).Job) },
	agentpb.Agent_ReportCorrupt_FullMethodName: func(_ *Agent, r any) (string, error) { return named(r.(*agentpb.VerifyRequest).Job) },
	agentpb.Agent_Delete_FullMethodName:        func(_ *Agent, r any) (string, error) { return named(r.(*agentpb.DeleteRequest).Job) },
	agentpb.Agent_Consistent_FullMethodName:    func(_ *Agent, r any) (string, error) { return named(r.(*agentpb.ConsistentRequest).Job) },
	agentpb.Agent_Fetch_FullMethodName:         func(_ *Agent, r any) (string, error) { return named(r.(*agentpb.FetchRequest).Job) },
	agentpb.Agent_FinishRestore_FullMethodName: func(_ *Agent, r any) (string, error) { return named(r.(*agentpb.FinishRestoreRequest).Job) },
	agentpb.Agent_Status_FullMethodName:        func(*Agent, any) (string, error) { return "", nil },
	agentpb.Agent_Release_FullMethodName:       func(a *Agent, r any) (string, error) { return a.leaseJob(r.(*agentpb.ReleaseRequest).Lease), nil },
	agentpb.Agent_Fill_FullMethodName: func(a *Agent, r any) (string, error) {
		if job := a.leaseJob(r.(*agentpb.FillRequest).Lease); job != "" {
			return job, nil
		}
		return "", errors.New("it names no lease this agent holds")
	},
	agentpb.Agent_List_FullMethodName: func(_ *Agent, r any) (string, error) {
		if job := r.(*agentpb.ListRequest).Job; job != "" {
			return job, nil
		}
		return "", errors.New("it lists every job's shards; a rank lists its own job's: name the job")
	},
	agentpb.Agent_TierCopies_FullMethodName: func(*Agent, any) (string, error) {
		return "", errors.New("it lists every job's tier copies, for the coordinator over TCP")
	},
}

// named is the job a request names; every method that acts on one job
// requires it.
func named(job string) (string, error) {
	if job == "" {
		return "", errors.New("the request names no job")
	}
	return job, nil
}

// leaseJob returns the job of a lease, or "" for one the agent does not
// hold (releasing it does nothing).
func (a *Agent) leaseJob(id uint64) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l := a.leases[id]; l != nil {
		return l.r.job
	}
	if p := a.partials[id]; p != nil {
		return p.ps.Job
	}
	return ""
}

// guardUnary is the interceptor of unary calls, after the transport's.
func (a *Agent) guardUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := a.guard(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// guardStream checks a streaming call's first message.
func (a *Agent) guardStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if !a.cfg.JobKeys.Enabled() || transport.PeerFromContext(ss.Context()).Kind != transport.PeerLocal {
		return h(srv, ss)
	}
	return h(srv, &guardedStream{ServerStream: ss, a: a, method: info.FullMethod})
}

type guardedStream struct {
	grpc.ServerStream
	a       *Agent
	method  string
	checked bool
}

func (s *guardedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.checked {
		return nil
	}
	s.checked = true
	return s.a.guard(s.Context(), s.method, m)
}

// guard refuses a call over the socket whose token is not the job's the
// request acts on; calls over TCP and every call of an agent without job
// keys pass.
func (a *Agent) guard(ctx context.Context, method string, req any) error {
	if !a.cfg.JobKeys.Enabled() {
		return nil
	}
	p := transport.PeerFromContext(ctx)
	if p.Kind != transport.PeerLocal {
		return nil
	}
	of, ok := socketJobs[method]
	if !ok {
		return a.refuseJob("grpc", "agent: %s may not call %s over the socket: no rule allows it to a rank", p.Cred, method)
	}
	job, err := of(a, req)
	if err != nil {
		return a.refuseJob("grpc", "agent: %s may not call %s over the socket: %v", p.Cred, method, err)
	}
	if job == "" {
		return nil
	}
	return a.checkJobToken(job, tokenOf(ctx), p.Cred, method)
}

func tokenOf(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(TokenMetadata); len(v) > 0 {
		return v[0]
	}
	return ""
}

// checkJobToken refuses, PermissionDenied, a caller whose token is not
// job's; what names what it asked for.
func (a *Agent) checkJobToken(job, token string, cred *transport.Cred, what string) error {
	if !a.cfg.JobKeys.Enabled() {
		return nil
	}
	socket := "grpc"
	if what == "a segment" {
		socket = "segment"
	}
	switch err := a.cfg.JobKeys.Check(job, token); {
	case errors.Is(err, jobtoken.ErrNoToken):
		return a.refuseJob(socket, "agent: %s asked for %s of job %s with no job token; this agent isolates jobs: give the rank its job's token ($REWIND_JOB_TOKEN or $REWIND_JOB_TOKEN_FILE)",
			cred, what, job)
	case err != nil:
		return a.refuseJob(socket, "agent: %s asked for %s of job %s with a token that is not job %s's (another job's, or minted with a retired key)",
			cred, what, job, job)
	}
	return nil
}

func (a *Agent) refuseJob(socket, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	a.metrics.jobRefused.WithLabelValues(socket).Inc()
	a.log.Warn("call refused", "why", msg)
	return status.Error(codes.PermissionDenied, msg)
}
