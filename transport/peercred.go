package transport

import (
	"context"
	"fmt"
)

// Cred is who is at the other end of a Unix socket: the process that
// connected, its user and its group, as the kernel saw them at connect.
type Cred struct {
	PID      int32
	UID, GID uint32
}

func (c *Cred) String() string {
	if c == nil {
		return "a local process (credentials unknown)"
	}
	return fmt.Sprintf("pid %d (uid %d, gid %d)", c.PID, c.UID, c.GID)
}

// PeerFromContext returns who is at the other end of the connection of a
// gRPC call served with ServerOption.
func PeerFromContext(ctx context.Context) Peer { return peerFrom(ctx) }
