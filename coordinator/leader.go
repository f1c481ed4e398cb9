package coordinator

import (
	"context"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/internal/metricsrv"
	"rewind.dev/rewind/transport"
)

// With leader election (Config.Leading set, rewind coordinator --kube),
// only the leader serves. A follower answers every call with Unavailable
// (agents and the CLI retry, and reach the leader through the Service
// once it routes there), and its /readyz says 503, so that the Service's
// endpoints are the leader alone: several replicas never split agents
// between indexes. A new leader's index is rebuilt from the agents, which
// re-register with their inventory when their connection moves to it;
// until then it answers about jobs Unavailable (rebuild.go).

// leading reports whether this coordinator serves.
func (c *Coordinator) leading() bool {
	return c.cfg.Leading == nil || c.cfg.Leading()
}

// errNotLeader is a follower's answer.
var errNotLeader = status.Error(codes.Unavailable, "coordinator: this replica is not the leader; retry through the coordinator Service")

func (c *Coordinator) unaryLeader(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if !c.leading() {
		c.followed.Store(true)
		return nil, errNotLeader
	}
	return h(ctx, req)
}

func (c *Coordinator) streamLeader(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if !c.leading() {
		c.followed.Store(true)
		return errNotLeader
	}
	return h(srv, ss)
}

// readyz is the readiness endpoint: 200 while this coordinator serves.
func (c *Coordinator) readyz() metricsrv.Route {
	return metricsrv.Route{Path: "/readyz", Method: transport.HTTPReady, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !c.leading() {
			http.Error(w, "not the leader", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})}
}
