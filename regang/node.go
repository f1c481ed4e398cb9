package regang

import (
	"context"
	"maps"
	"slices"

	"rewind.dev/rewind/api/coordpb"
)

// Node drives one node's share of a job, where every node runs a
// supervisor of its own (`rewind node`, one per container or host)
// instead of one driver running every rank: it runs only the ranks a
// placement puts on node Name. On a recovery it kills the ranks it runs
// (a rank stuck in a collective may never ask the SDK again) and starts
// those the event places on it, resuming from the event's step. The
// other nodes' supervisors do the same with their part, each from the
// same event.
//
// Regang must not run concurrently with other calls on Local that start
// or kill ranks; the caller serializes them.
type Node struct {
	Name  string
	Local *Local
}

var _ Driver = (*Node)(nil)

// Regang kills this node's ranks and starts those the event places here.
func (n *Node) Regang(ctx context.Context, ev *coordpb.JobEvent) error {
	n.Local.KillAll()
	return n.Local.Start(OnNode(ev.Placement, n.Name), WorldSize(ev), ev.Step)
}

// OnNode returns the part of placement (rank -> node) on node.
func OnNode(placement map[uint32]string, node string) map[uint32]string {
	out := map[uint32]string{}
	for r, n := range placement {
		if n == node {
			out[r] = n
		}
	}
	return out
}

// Running returns the ranks whose processes Local started and that have
// not exited (as far as Wait has seen) nor been killed, in order.
func (l *Local) Running() []uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(maps.Keys(l.procs))
}

// Kill kills one rank's process, if it runs; its exit is not a failure.
func (l *Local) Kill(rank uint32) { l.killAll([]uint32{rank}) }
