package coordpb

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// A connection to the coordinator whose far end vanished without a reset
// (its host died, a standby took over on another address) would look
// open for good: an agent's order stream, or a follower's WatchJob, would
// wait on it forever instead of reconnecting. Clients ping an idle
// connection every KeepaliveTime and drop it when no answer comes within
// KeepaliveTimeout; the coordinator accepts those pings.
const (
	KeepaliveTime    = 10 * time.Second
	KeepaliveTimeout = 5 * time.Second
)

// KeepaliveDial is the dial option of a long-lived client of the
// coordinator (agents, node supervisors).
func KeepaliveDial() grpc.DialOption {
	return grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout, PermitWithoutStream: true})
}

// KeepaliveServer is the coordinator's server options: its clients' pings
// are let through (the default policy answers a ping more often than
// every 5 minutes with GOAWAY), and it pings an idle client connection
// itself, so that a dead agent's order stream does not look open.
func KeepaliveServer() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveTime / 2, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout}),
	}
}
