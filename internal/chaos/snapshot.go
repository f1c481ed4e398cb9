package chaos

import (
	"slices"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// Snapshot is the coordinator's view of the job at one moment: its steps
// with their copies and tier copies, and every connected node's tiers.
type Snapshot struct {
	At    time.Time
	Job   *coordpb.Job // nil until the job is known
	Steps []*coordpb.Step
	Nodes []*coordpb.NodeTiers
}

// sharedNode is the node name the coordinator gives a copy on a shared
// tier (the object store): every node reaches it.
const sharedNode = "-"

// Step returns step n, or nil.
func (s *Snapshot) Step(n int64) *coordpb.Step {
	if s == nil {
		return nil
	}
	for _, st := range s.Steps {
		if st.Step == n {
			return st
		}
	}
	return nil
}

// LatestConsistent returns the newest consistent step, or -1.
func (s *Snapshot) LatestConsistent() int64 {
	latest := int64(-1)
	if s == nil {
		return latest
	}
	for _, st := range s.Steps {
		if st.State == coordpb.StepState_STEP_STATE_CONSISTENT {
			latest = max(latest, st.Step)
		}
	}
	return latest
}

// Durable returns the steps with a durable copy on tier, ascending.
func (s *Snapshot) Durable(tier string) []int64 {
	var out []int64
	if s == nil {
		return out
	}
	for _, st := range s.Steps {
		if durableOn(st, tier) {
			out = append(out, st.Step)
		}
	}
	slices.Sort(out)
	return out
}

func durableOn(st *coordpb.Step, tier string) bool {
	for _, tc := range st.Tiers {
		if tc.Tier == tier && tc.State == coordpb.TierCopyState_TIER_COPY_STATE_DURABLE {
			return true
		}
	}
	return false
}

// NewestRestorable returns the newest step the coordinator can restore
// with the nodes in down lost, as its planner decides: consistent, and
// every rank has a copy on a shared tier or on a node not down. -1: none.
func (s *Snapshot) NewestRestorable(down map[string]bool) int64 {
	best := int64(-1)
	if s == nil {
		return best
	}
	for _, st := range s.Steps {
		if st.State != coordpb.StepState_STEP_STATE_CONSISTENT || st.RanksCommitted != st.WorldSize || st.Step <= best {
			continue
		}
		ok := true
		for r := range st.WorldSize {
			if !slices.ContainsFunc(st.Copies, func(c *coordpb.Copy) bool {
				return c.Rank == r && (c.Node == sharedNode || !down[c.Node])
			}) {
				ok = false
				break
			}
		}
		if ok {
			best = st.Step
		}
	}
	return best
}

// Holders returns the nodes holding rank's shard of step in memory (its
// own node and its replicas' nodes), in the coordinator's order.
func (s *Snapshot) Holders(step int64, rank uint32) []string {
	var out []string
	if st := s.Step(step); st != nil {
		for _, c := range st.Copies {
			if c.Rank == rank && c.Tier == "shm" {
				out = append(out, c.Node)
			}
		}
	}
	return out
}

// Tier returns a node's health of tier, or nil.
func (s *Snapshot) Tier(node, tier string) *coordpb.TierHealth {
	if s == nil {
		return nil
	}
	for _, n := range s.Nodes {
		if n.Node != node {
			continue
		}
		for _, h := range n.Tiers {
			if h.Tier == tier {
				return h
			}
		}
	}
	return nil
}

// TransferRunning returns a node (of those in nodes, any when empty) with
// a transfer to tier queued or running.
func (s *Snapshot) TransferRunning(tier string, nodes ...string) (string, bool) {
	if s == nil {
		return "", false
	}
	for _, n := range s.Nodes {
		if len(nodes) > 0 && !slices.Contains(nodes, n.Node) {
			continue
		}
		for _, h := range n.Tiers {
			if h.Tier == tier && h.Running > 0 {
				return n.Node, true
			}
		}
	}
	return "", false
}

// Placement returns the job's placement (rank -> node).
func (s *Snapshot) Placement() map[uint32]string {
	if s == nil || s.Job == nil {
		return nil
	}
	return s.Job.Placement
}
