package coordinator

import (
	"context"
	"fmt"

	"rewind.dev/rewind/api/agentpb"
)

// Shards of rank numbers a job no longer has. A job that shrank (an
// elastic recovery, or a registration with a smaller world size) leaves
// in the nodes' memory the shards its old gang saved under rank numbers
// at or above its new world size: no rank of those numbers saves again
// to rotate them out of their slots, so they would hold the nodes'
// budget until an operator deleted their steps. The new gang needs them
// until its own state survives the loss of a node: once the job's
// protected step (every rank's shard in two nodes' memory) was saved at
// the job's world size, the coordinator deletes those copies of older
// steps from the agents' memory. The steps' copies on the tiers stay
// (a restore of such a step reads its dropped ranks there); the step
// and the copies of its other ranks are left to the usual rotation and
// retention.

// droppedKey names a copy being deleted, so that it is asked for once.
type droppedKey struct {
	job       string
	step      int64
	rank      uint32
	node      string
	worldSize uint32
	sum       string
}

// droppedCopiesLocked returns the copies in memory of job j that are
// dropped rank numbers of steps older than its protected step, once that
// step is at the job's world size, and not being deleted already; it
// marks them being deleted. Nothing while the job's index is being
// rebuilt (it may not know every copy yet) or this coordinator does not
// lead. The caller holds c.mu.
func (c *Coordinator) droppedCopiesLocked(j *Job) []droppedKey {
	if !c.stillDroppedLocked(j.ID, j.WorldSize) {
		return nil
	}
	var out []droppedKey
	for n, st := range j.Steps {
		if n >= j.Protected {
			continue
		}
		for rank := j.WorldSize; rank < st.WorldSize; rank++ {
			for _, cp := range st.Copies[rank] {
				k := droppedKey{job: j.ID, step: n, rank: rank, node: cp.Node, worldSize: st.WorldSize, sum: cp.Sum}
				if cp.Tier != "shm" || c.downLocked(cp.Node) || c.dropping[k] {
					continue
				}
				if c.dropping == nil {
					c.dropping = map[droppedKey]bool{}
				}
				c.dropping[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}

// stillDroppedLocked reports whether rank is a dropped rank number of
// job, whose copies of steps older than its protected step may go: the
// job runs below it, its protected step is at its world size, its index
// is not being rebuilt and this coordinator leads. The caller holds c.mu.
func (c *Coordinator) stillDroppedLocked(job string, rank uint32) bool {
	j := c.state.Jobs[job]
	if j == nil || rank < j.WorldSize || j.Protected < 0 || !c.leading() || c.rebuildingLocked(job) != nil {
		return false
	}
	prot := j.Steps[j.Protected]
	return prot != nil && prot.WorldSize == j.WorldSize
}

// freeDropped deletes the copies from their agents' memory and records
// them deleted. Each is checked again just before (the job may have grown
// back meanwhile). A copy whose agent could not delete it (unreachable, a
// reader holding it) is asked for again at a later report of its job.
func (c *Coordinator) freeDropped(ctx context.Context, copies []droppedKey) {
	var gone []Record
	for _, k := range copies {
		c.mu.Lock()
		still := c.stillDroppedLocked(k.job, k.rank)
		if j := c.state.Jobs[k.job]; still && k.step >= j.Protected {
			still = false
		}
		c.mu.Unlock()
		if !still {
			continue
		}
		var deleted uint32
		err := c.agentCall(ctx, k.node, func(ctx context.Context, a agentpb.AgentClient) error {
			resp, err := a.Delete(ctx, &agentpb.DeleteRequest{Job: k.job, Rank: k.rank, Step: k.step})
			deleted = resp.GetDeleted()
			return err
		})
		switch {
		case err != nil:
			c.log.Warn("could not free a dropped rank's shard", "job", k.job, "step", k.step, "rank", k.rank, "node", k.node, "err", err)
		case deleted == 0:
			c.log.Info("a dropped rank's shard is being read, or gone already; asking again later", "job", k.job, "step", k.step, "rank", k.rank, "node", k.node)
		default:
			gone = append(gone, Record{Job: k.job, Step: k.step, Rank: k.rank, WorldSize: k.worldSize, Node: k.node, Tier: "shm", Sum: k.sum, State: CopyDeleted})
		}
	}
	if len(gone) > 0 {
		if _, err := c.report("", gone); err != nil {
			c.log.Warn("recording dropped ranks' shards deleted", "err", err)
		} else {
			c.metrics.droppedFreed.Add(float64(len(gone)))
			c.log.Info("freed the shards of rank numbers the job no longer has", "job", gone[0].Job, "copies", len(gone),
				"ranks", fmt.Sprint(ranksOf(gone)))
		}
	}
	c.mu.Lock()
	for _, k := range copies {
		delete(c.dropping, k)
	}
	c.mu.Unlock()
}

func ranksOf(recs []Record) []uint32 {
	seen := map[uint32]bool{}
	var out []uint32
	for _, r := range recs {
		if !seen[r.Rank] {
			seen[r.Rank] = true
			out = append(out, r.Rank)
		}
	}
	return out
}
