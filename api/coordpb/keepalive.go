package coordpb

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
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

// ReconnectDial is the coordinator's clients' reconnect policy: gRPC's
// default backs a broken connection off up to 2 minutes, during which
// every call fails at once, whatever the caller's own retry loop does;
// a coordinator that comes back (a restart, a standby taking the lease)
// would not hear from its agents for that long, and declare live nodes
// absent. The connection is tried again within MaxReconnectDelay.
func ReconnectDial() grpc.DialOption {
	return grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: MaxReconnectDelay},
		MinConnectTimeout: 5 * time.Second,
	})
}

// MaxReconnectDelay bounds the wait between two tries of a broken
// connection to the coordinator (the agents' own retry loops wait at
// most 5 s).
const MaxReconnectDelay = 2 * time.Second

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
