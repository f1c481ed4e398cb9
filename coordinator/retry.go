package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Stalled recoveries: a job whose re-gang failed because no live node
// could run its ranks, or no step could be planned from the live nodes
// (the nodes holding its copies are down), waits for a node to come
// back. Failure detection under load can declare live nodes dead (a
// saturated CPU misses its acks), and without a retry such a job stays
// down for good once they answer again. Each node that comes back (an
// agent registers, or a node declared dead answers a direct ping) starts
// one more try of every stalled job; a try that fails again stalls the
// job again until the next node comes back, so there is at most one
// pending retry per job and no loop.

// stalledRecovery is the recovery a job waits to retry.
type stalledRecovery struct {
	node, reason string    // the node whose death started it, and why
	detected     time.Time // when that death was declared
}

// stall records that job's recovery failed for want of live nodes, to
// be retried when a node comes back. A job that no longer exists is not.
func (c *Coordinator) stall(job, node, reason string, detected time.Time, err error) {
	if errors.Is(err, ErrUnknownJob) || errors.Is(err, ErrNotFound) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stalled == nil {
		c.stalled = map[string]stalledRecovery{}
	}
	c.stalled[job] = stalledRecovery{node: node, reason: reason, detected: detected}
	c.log.Warn("job recovery stalled until a node comes back", "job", job, "node", node, "err", err)
}

// unstall forgets job's stalled recovery: the job was re-ganged.
func (c *Coordinator) unstall(job string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.stalled, job)
}

// retryStalled starts one more recovery of every stalled job, as node
// came back.
func (c *Coordinator) retryStalled(node string) {
	c.mu.Lock()
	stalled := c.stalled
	c.stalled = nil
	c.mu.Unlock()
	for _, job := range slices.Sorted(maps.Keys(stalled)) {
		s := stalled[job]
		c.log.Info("retrying a stalled job recovery", "job", job, "node_back", node)
		reason := fmt.Sprintf("%s; retried as node %s came back", s.reason, node)
		go c.recoverJob(context.Background(), job, s.node, reason, s.detected)
	}
}
