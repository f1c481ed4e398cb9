package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"rewind.dev/rewind/internal/clock"
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

// stall records that job's recovery failed for want of live nodes (none
// to run its ranks, or none but the tiers holding a copy of every rank of
// some step), to be retried when a node comes back. A job that no longer
// exists is not.
func (c *Coordinator) stall(job, node, reason string, detected time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.retrying, job)
	if errors.Is(err, ErrUnknownJob) {
		return
	}
	c.stallLocked(job, node, reason, detected)
	c.log.Warn("job recovery stalled until a node comes back", "job", job, "node", node, "err", err)
}

// stallLocked records job's stalled recovery. The caller holds c.mu.
func (c *Coordinator) stallLocked(job, node, reason string, detected time.Time) {
	if c.stalled == nil {
		c.stalled = map[string]stalledRecovery{}
	}
	c.stalled[job] = stalledRecovery{node: node, reason: reason, detected: detected}
}

// unstall forgets job's stalled recovery: the job was re-ganged.
func (c *Coordinator) unstall(job string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.stalled, job)
	delete(c.retrying, job)
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

// A recovery can also fail after its plan: a rank's restore fails because
// the node restoring it, or the only node holding the copy it reads, died
// after the plan was made and before its death was declared. Nothing else
// would start the job's recovery again: the node that died may run none
// of the job's ranks (a spare taking a rank, a replica's holder), so its
// death starts no recovery, and the job's live ranks, told their gang is
// broken, would wait for good. Such a recovery is tried again after a
// backoff (1 s, doubling, at most 30 s), planned afresh from the nodes
// alive then, up to Config.RecoveryRetries times in a row; after that the
// job stalls, as one with no live node to run on, until a node comes back
// or an operator restores it.
const (
	firstRetryAfter = time.Second
	maxRetryAfter   = 30 * time.Second
)

// errStoreNotServing marks a recovery that failed only because a store
// did not serve copies of the step it planned (stage.go): nothing is
// wrong with the step, and no node coming back would help, so it is
// tried again every maxRetryAfter past Config.RecoveryRetries, until the
// store serves or an operator restores the job, rather than stalled.
var errStoreNotServing = errors.New("a store did not serve the step's copies")

// failedRecovery is a job's recovery to try again.
type failedRecovery struct {
	node, reason string    // the first failed try's
	detected     time.Time // when that node's death was declared
	attempts     int       // failed tries in a row
}

// retryFailed schedules one more try of job's recovery, which failed
// after its plan (err), or stalls the job after Config.RecoveryRetries
// such failures in a row.
func (c *Coordinator) retryFailed(job, node, reason string, detected time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return
	}
	f := &failedRecovery{node: node, reason: reason, detected: detected, attempts: 1}
	if prev := c.retrying[job]; prev != nil {
		f.node, f.reason, f.detected, f.attempts = prev.node, prev.reason, prev.detected, prev.attempts+1
	}
	if f.attempts > c.cfg.RecoveryRetries && (c.cfg.RecoveryRetries == 0 || !errors.Is(err, errStoreNotServing)) {
		delete(c.retrying, job)
		c.stallLocked(job, f.node, f.reason, f.detected)
		c.log.Error("job recovery failed every try; it waits for a node to come back or an operator's restore",
			"job", job, "tries", f.attempts, "err", err)
		return
	}
	if c.retrying == nil {
		c.retrying = map[string]*failedRecovery{}
	}
	c.retrying[job] = f
	delete(c.stalled, job) // the tries take its place; the last one failing stalls it again
	after := firstRetryAfter
	for i := 1; i < f.attempts && after < maxRetryAfter; i++ { // doubling, without overflow for many tries
		after *= 2
	}
	after = min(after, maxRetryAfter)
	c.log.Warn("job recovery failed; trying it again", "job", job, "retry", f.attempts, "of", c.cfg.RecoveryRetries, "after", after, "err", err)
	c.bg.Add(1) // Close waits for the backoff, not for the recovery after it, as for any recovery
	go func() {
		slept := clock.Sleep(c.bgCtx, after) == nil
		c.bg.Done()
		due := func() bool { // checked again under the job's lock: no recovery ended since
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.retrying[job] == f && !c.closing
		}
		if !slept || !due() {
			return
		}
		if c.retryFired != nil {
			c.retryFired(job)
		}
		if !c.leading() { // the leader's own recovery of the job takes over (unfinished.go)
			c.mu.Lock()
			if c.retrying[job] == f {
				delete(c.retrying, job)
			}
			c.mu.Unlock()
			return
		}
		reason := fmt.Sprintf("%s; retry %d of %d after a failed recovery", f.reason, f.attempts, c.cfg.RecoveryRetries)
		if f.attempts > c.cfg.RecoveryRetries {
			reason = fmt.Sprintf("%s; retry %d after a failed recovery, waiting for a store to serve the step", f.reason, f.attempts)
		}
		c.recoverJobIf(c.bgCtx, job, f.node, reason, f.detected, due)
	}()
}
