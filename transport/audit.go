package transport

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/internal/clock"
)

// An AuditEntry is one call a server's Audit records: who made it, what
// it asked, when, and how it ended.
type AuditEntry struct {
	At     time.Time
	Who    string // Who(ctx)
	Method string // the full gRPC method name
	AuditArgs
	Code  codes.Code // codes.OK when the call succeeded
	Error string     // the status message of a failed call
}

// AuditArgs are a request's key arguments.
type AuditArgs struct {
	Job     string
	Step    int64
	HasStep bool
	Node    string
	// Detail holds the other arguments that matter, as "key=value" words.
	Detail string
}

// An AuditRule says whether a call of one method by caller is recorded
// when it is served (a call that changes state), and with which
// arguments. A refused call is recorded whatever the rule says.
type AuditRule func(caller Peer, req any) (args AuditArgs, record bool)

// Audited is the AuditRule of a method whose every call changes state:
// recorded with ArgsOf, and detail's words when detail is set.
func Audited(detail func(req any) string) AuditRule {
	return func(_ Peer, req any) (AuditArgs, bool) {
		a := ArgsOf(req)
		if detail != nil && req != nil {
			a.Detail = detail(req)
		}
		return a, true
	}
}

// ArgsOf reads the job, step and node a request names through the
// getters protobuf generates (GetJob, GetStep, GetNode).
func ArgsOf(req any) AuditArgs {
	var a AuditArgs
	if r, ok := req.(interface{ GetJob() string }); ok {
		a.Job = r.GetJob()
	}
	if r, ok := req.(interface{ GetStep() int64 }); ok {
		a.Step, a.HasStep = r.GetStep(), true
	}
	if r, ok := req.(interface{ GetNode() string }); ok {
		a.Node = r.GetNode()
	}
	return a
}

// Audit records a server's calls through record: the calls of methods
// its rules name, when their rule says so, and every call refused
// Unauthenticated or PermissionDenied, whatever the method. It is first
// in a server's interceptor chains, before the Authorizer, so that it
// sees the refusals. record is called after the call ends, on the call's
// goroutine, concurrently for concurrent calls.
type Audit struct {
	rules  map[string]AuditRule
	clock  clock.Clock
	record func(AuditEntry)
}

// NewAudit returns an audit of a server's calls.
func NewAudit(rules map[string]AuditRule, clk clock.Clock, record func(AuditEntry)) *Audit {
	return &Audit{rules: rules, clock: clk, record: record}
}

// Refused reports whether err is a refusal the audit records for every
// method.
func Refused(err error) bool {
	c := status.Code(err)
	return c == codes.Unauthenticated || c == codes.PermissionDenied
}

// Who names the caller of a gRPC call: its certificate's identity
// (node/gpu-17), "local" over a Unix socket, "plaintext ADDR" on a
// connection without TLS, "unauthenticated ADDR" for a TLS client with no
// valid certificate.
func Who(ctx context.Context) string {
	addr := "?"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	p := peerFrom(ctx)
	switch {
	case p.Kind == PeerLocal:
		return "local"
	case p.Kind == PeerPlain:
		return "plaintext " + addr
	case p.Err != nil:
		return "unauthenticated " + addr
	}
	return p.Identity.String()
}

func (a *Audit) entry(ctx context.Context, method string, req any, err error) (AuditEntry, bool) {
	var args AuditArgs
	record := false
	if rule, ok := a.rules[method]; ok && req != nil {
		args, record = rule(peerFrom(ctx), req)
	} else if req != nil {
		args = ArgsOf(req)
	}
	if !record && !Refused(err) {
		return AuditEntry{}, false
	}
	e := AuditEntry{At: a.clock.Now(), Who: Who(ctx), Method: method, AuditArgs: args, Code: status.Code(err)}
	if err != nil {
		e.Error = status.Convert(err).Message()
	}
	return e, true
}

// Unary is the interceptor of unary calls.
func (a *Audit) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if e, ok := a.entry(ctx, info.FullMethod, req, err); ok {
		a.record(e)
	}
	return resp, err
}

// Stream is the interceptor of streaming calls: a stream is recorded when
// it ends, with the last message its client sent (the one a per-message
// check refused), when its method's rule records it or it was refused.
func (a *Audit) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	rs := &recordingStream{ServerStream: ss}
	err := h(srv, rs)
	if e, ok := a.entry(ss.Context(), info.FullMethod, rs.last, err); ok {
		a.record(e)
	}
	return err
}

// recordingStream keeps the last message its client sent.
type recordingStream struct {
	grpc.ServerStream
	last any
}

func (s *recordingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.last = m
	}
	return err
}

// Words formats key=value pairs for AuditArgs.Detail, skipping pairs whose
// value is empty.
func Words(kv ...any) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		v := fmt.Sprint(kv[i+1])
		if v == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%v=%s", kv[i], v)
	}
	return b.String()
}
