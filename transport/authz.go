package transport

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Authorizer enforces Rules on a server's calls: first in its interceptor
// chains, and on the agents' data path (Allow). A refusal is
// Unauthenticated (no verified certificate) or PermissionDenied (a role
// or a request the rules do not allow), its message naming the caller
// and the method; it is logged and counted.
type Authorizer struct {
	s       *Security
	rules   map[string]Rule
	log     *slog.Logger
	refused *prometheus.CounterVec
}

// NewAuthorizer returns the authorizer of a server protected by s; its
// refusals are counted on reg (nil: not counted).
func NewAuthorizer(s *Security, log *slog.Logger, reg prometheus.Registerer) (*Authorizer, error) {
	a := &Authorizer{s: s, rules: Rules, log: log,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rewind_transport_refused_calls_total",
			Help: "Calls refused by transport authorization, by gRPC code (Unauthenticated, PermissionDenied)."}, []string{"code"})}
	if reg != nil {
		if err := reg.Register(a.refused); err != nil {
			return nil, fmt.Errorf("transport: metrics: %w", err)
		}
	}
	return a, nil
}

// Allow decides whether p may call method with req (nil: check the
// caller's role only); the error is a gRPC status.
func (a *Authorizer) Allow(p Peer, method string, req any) error {
	rule, err := a.admit(p, method)
	if err != nil || rule == nil || req == nil {
		return err
	}
	return a.check(p, method, rule, req)
}

// admit checks the caller's role; the rule it returns checks requests
// (nil: every request is allowed).
func (a *Authorizer) admit(p Peer, method string) (*Rule, error) {
	switch {
	case p.Kind == PeerLocal:
		return nil, nil
	case p.Kind == PeerPlain && !a.s.TLS():
		return nil, nil
	case p.Kind == PeerPlain:
		return nil, a.refuse(codes.Unauthenticated, "transport: a plaintext connection called %s; this server takes TLS only", method)
	}
	rule, ok := a.rules[method]
	switch {
	case p.Err != nil && ok && rule.Uncertified:
		return nil, nil
	case p.Err != nil:
		return nil, a.refuse(codes.Unauthenticated, "transport: %s refused to an unauthenticated caller: %v", method, p.Err)
	case !ok:
		return nil, a.refuse(codes.PermissionDenied, "transport: %s may not call %s: no rule allows it to anyone", p.Identity, method)
	case len(rule.Roles) == 0:
		return nil, a.refuse(codes.PermissionDenied, "transport: %s may not call %s: it is for the agent's Unix socket only", p.Identity, method)
	case !slices.Contains(rule.Roles, p.Identity.Role):
		return nil, a.refuse(codes.PermissionDenied, "transport: %s may not call %s (%s only)", p.Identity, method, roleList(rule.Roles))
	}
	if rule.Check == nil {
		return nil, nil
	}
	return &rule, nil
}

func (a *Authorizer) check(p Peer, method string, rule *Rule, req any) error {
	if err := rule.Check(p.Identity, req); err != nil {
		return a.refuse(codes.PermissionDenied, "transport: %s may not call %s: %v", p.Identity, method, err)
	}
	return nil
}

func (a *Authorizer) refuse(code codes.Code, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	a.refused.WithLabelValues(code.String()).Inc()
	a.log.Warn("call refused", "code", code.String(), "why", msg)
	return status.Error(code, msg)
}

func roleList(rs []Role) string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.String()
	}
	return strings.Join(names, ", ")
}

// CallerOf is who made the gRPC call of ctx (a server's handler's
// context): PeerPlain when its connection is of no kind this package
// knows.
func CallerOf(ctx context.Context) Peer { return peerFrom(ctx) }

// peerFrom is the Peer of a gRPC call's connection.
func peerFrom(ctx context.Context) Peer {
	if p, ok := peer.FromContext(ctx); ok {
		if ai, ok := p.AuthInfo.(AuthInfo); ok {
			return ai.Peer
		}
	}
	return Peer{Kind: PeerPlain}
}

// Unary is the interceptor of unary calls.
func (a *Authorizer) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := a.Allow(peerFrom(ctx), info.FullMethod, req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

// Stream is the interceptor of streaming calls: the role at the start,
// and each message the client sends against the rule's Check.
func (a *Authorizer) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	p := peerFrom(ss.Context())
	rule, err := a.admit(p, info.FullMethod)
	if err != nil {
		return err
	}
	if rule != nil {
		ss = &checkedStream{ServerStream: ss, a: a, p: p, method: info.FullMethod, rule: rule}
	}
	return h(srv, ss)
}

// checkedStream checks every message a client sends.
type checkedStream struct {
	grpc.ServerStream
	a      *Authorizer
	p      Peer
	method string
	rule   *Rule
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.a.check(s.p, s.method, s.rule, m)
}
