package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/faultinject"
)

// Recovery: a node is declared dead (failure detection, or an operator).
// For every job with a rank on it, the coordinator
//
//  1. tells the agents of the job's other nodes that the gang is broken,
//     so the ranks still alive get a clear error from their next call
//     instead of hanging in a collective;
//  2. moves the dead node's ranks to spare nodes (registered agents
//     running none of the job's ranks), else to the surviving nodes with
//     the fewest of its ranks;
//  3. plans the newest step whose every rank has a good copy on a live
//     node or a shared tier;
//  4. has each rank's new node stage the shard from the cheapest source
//     that serves it verified, and if some rank cannot be, marks the step
//     unrestorable and tries the next older one (stage.go);
//  5. switches every rank to the staged step at once, drops the job's
//     later steps (a timeline no rank will continue), tells the agents
//     the gang may save again, and tells whoever runs the job's ranks
//     (WatchJob) to restart them on the new placement, restoring the
//     step, with the timeline of the recovery and the steps passed over.
//
// Nothing happens without quorum (Config.Quorum): a coordinator cut off
// with a minority of the cluster must not recover jobs whose nodes are
// merely on the other side.

// watchers are the streams of job events, by job. Each event gets the
// next seq, and the last of each job is kept for a watcher that missed it
// (WatchJobRequest.replay).
type watchers struct {
	mu   sync.Mutex
	subs map[string][]chan *coordpb.JobEvent
	last map[string]*coordpb.JobEvent
	seq  uint64 // the last event's; starts from the clock, so it grows across restarts
}

// watch subscribes to job's events. With replay, the job's last event
// comes first when its seq is above after. It returns the seq of the last
// event published so far.
func (w *watchers) watch(job string, replay bool, after uint64) (<-chan *coordpb.JobEvent, uint64, func()) {
	ch := make(chan *coordpb.JobEvent, 16)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.subs == nil {
		w.subs = map[string][]chan *coordpb.JobEvent{}
	}
	if ev := w.last[job]; replay && ev != nil && ev.Seq > after {
		ch <- ev
	}
	w.subs[job] = append(w.subs[job], ch)
	return ch, w.seq, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.subs[job] = slices.DeleteFunc(w.subs[job], func(x chan *coordpb.JobEvent) bool { return x == ch })
	}
}

func (w *watchers) publish(ev *coordpb.JobEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq = max(w.seq+1, uint64(time.Now().UnixNano()))
	ev.Seq = w.seq
	if w.last == nil {
		w.last = map[string]*coordpb.JobEvent{}
	}
	w.last[ev.Job] = ev
	for _, ch := range w.subs[ev.Job] {
		select {
		case ch <- ev:
		default: // a watcher that does not read loses events, never blocks recovery
		}
	}
}

// NodeDown declares node dead and starts the recovery of every job with a
// rank on it; it returns those jobs. Without quorum it refuses.
func (c *Coordinator) NodeDown(node, reason string) ([]string, error) {
	return c.nodeDown(node, reason, false)
}

// nodeDown is NodeDown; detected says failure detection declared the
// node dead, not an operator. Such a verdict can be stale: as a partition
// heals, the members cut off spread the deaths they declared of the
// others, and a live node is declared dead until it refutes it. So a node
// failure detection names that answers a direct ping is left alone.
func (c *Coordinator) nodeDown(node, reason string, detected bool) ([]string, error) {
	reached, ok := c.quorum()
	if !ok {
		c.log.Warn("node reported down, but this coordinator sees no quorum: no recovery from this side of a partition", "node", node, "reason", reason)
		return nil, fmt.Errorf("%w: coordinator: no quorum of the cluster is reachable; %s is not recovered from here", ErrRefused, node)
	}
	if detected && slices.Contains(reached, node) {
		return nil, fmt.Errorf("%w: coordinator: %s answers a direct ping: its death is a stale verdict (a partition healing); not recovered", ErrRefused, node)
	}
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	var jobs []string
	for id, j := range c.state.Jobs {
		if slices.Contains(slices.Collect(maps.Values(j.Placement)), node) {
			jobs = append(jobs, id)
		}
	}
	// A node known only from a job's placement (its agent never
	// registered here: it died before this coordinator began to lead,
	// whose index was rebuilt from the agents still alive) is declared
	// down all the same.
	if _, ok := c.state.Nodes[node]; !ok && len(jobs) == 0 {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: coordinator: no node %q", ErrNotFound, node)
	}
	if _, already := c.down[node]; already {
		c.mu.Unlock()
		return nil, nil
	}
	c.down[node] = now
	c.endCallsLocked(node, reason)
	if detected {
		if c.detectedDown == nil {
			c.detectedDown = map[string]bool{}
		}
		c.detectedDown[node] = true
	}
	c.mu.Unlock()
	c.dropQueued(node)
	slices.Sort(jobs)
	c.log.Warn("node down", "node", node, "reason", reason, "jobs", jobs)
	for _, job := range jobs {
		// Nodes lost together (a rack) each start a recovery of the job;
		// the first to run moves every lost rank, and the others find
		// nothing left to move.
		go c.recoverJobIf(context.Background(), job, node, reason, now, func() bool { return c.recoveryDue(job, now) })
	}
	return jobs, nil
}

// nodeUp clears a node's down mark: its agent registered again, or,
// declared dead by failure detection, it answers a direct ping. The jobs
// whose recovery stalled for want of live nodes are tried again
// (retry.go).
func (c *Coordinator) nodeUp(node string) {
	c.mu.Lock()
	delete(c.down, node)
	delete(c.detectedDown, node)
	c.mu.Unlock()
	c.retryStalled(node)
}

// recoverJob runs one job's recovery; recoveries of one job run one at a
// time.
func (c *Coordinator) recoverJob(ctx context.Context, job, node, reason string, detected time.Time) {
	c.recoverJobIf(ctx, job, node, reason, detected, nil)
}

// recoverJobIf is recoverJob that, once it holds the job's lock, goes on
// only if due (when set) says the recovery is still due: a retry whose
// job another recovery, or an operator's restore, brought back while it
// waited for the lock must not restart the gang again.
func (c *Coordinator) recoverJobIf(ctx context.Context, job, node, reason string, detected time.Time, due func() bool) {
	lock := c.jobLock(job)
	lock.Lock()
	defer lock.Unlock()
	if due != nil && !due() {
		return
	}
	why := fmt.Sprintf("node %s down: %s", node, reason)
	if node == "" { // no node's death: a recovery its predecessor left unfinished
		why = reason
	}
	ev := &coordpb.JobEvent{Job: job, Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Reason: why, Node: node,
		DetectedUnixNano: detected.UnixNano(), Sources: map[string]uint32{}}
	// A try that fails after its plan is made again (retry.go).
	fail := func(err error) {
		c.failRegang(ev, err)
		c.retryFailed(job, node, reason, detected, err)
	}
	if err := c.waitRebuilt(ctx, job); err != nil {
		fail(err)
		return
	}
	placement, err := c.replace(job)
	if err != nil {
		c.stall(job, node, reason, detected, err)
		c.failRegang(ev, err)
		return
	}
	// The steps' shards are staged on placement (the lost ranks' on live
	// nodes) either way; an elastic job that shrinks restarts on fewer
	// ranks, which read them all.
	target := gangTarget{placement: placement}
	if shrunk, ok := c.elasticTarget(job, node); ok {
		target = shrunk
	} else if grown, ok := c.growTarget(job, placement); ok {
		target = grown
	}
	plan, err := c.plan(ctx, job, -1, placement)
	if err != nil {
		c.stall(job, node, reason, detected, err)
		c.failRegang(ev, err)
		return
	}
	// The ranks still alive are told at once, before the restore: they
	// must not hang in a collective with the dead node's.
	ev.PlannedUnixNano = c.cfg.Clock.Now().UnixNano()
	aborted := plan.Step
	// The fence is stored before any agent hears of the new gang.
	if _, err := c.raiseEpoch(ctx, job, aborted); err != nil {
		fail(err)
		return
	}
	c.gangOrders(job, coordpb.OrderKind_ORDER_KIND_ABORT, aborted, ev.Reason)
	plan, stage, err := c.restore(ctx, job, -1, placement, plan, func(older int64) error {
		// The fence and the abort follow the restore back: the steps
		// after the older one are the left epoch's, and their slots are
		// wanted for its restore.
		if err := c.resumeEpochFrom(job, older); err != nil {
			return err
		}
		c.gangOrders(job, coordpb.OrderKind_ORDER_KIND_ABORT, older, ev.Reason)
		aborted = older
		return nil
	})
	if err != nil {
		fail(err)
		return
	}
	if !c.regang(ctx, plan, stage, aborted, target, ev) {
		err := errors.New(ev.Error)
		if waitsForStore(plan) {
			err = fmt.Errorf("%w: %s", errStoreNotServing, ev.Error)
		}
		c.retryFailed(job, node, reason, detected, err)
	}
}

// failRegang tells the job's watchers that its re-gang failed, and why.
func (c *Coordinator) failRegang(ev *coordpb.JobEvent, err error) {
	ev.Kind, ev.Error = coordpb.JobEventKind_JOB_EVENT_KIND_FAILED, err.Error()
	c.gangs.failed(ev.Job)
	c.jobs.reganged(ev)
	c.log.Error("job re-gang failed", "job", ev.Job, "node", ev.Node, "reason", ev.Reason, "err", err)
	c.watchers.publish(ev)
}

// regang switches the job to the plan's step, whose every rank's shard
// the restore staged on its node (stage, empty when the restore failed),
// moves the job onto the target's placement (and world size, when an
// elastic recovery shrinks it), and then tells the job's watchers (ev) to
// restart its ranks there; the ranks still running are told their gang is
// broken first (again when aborted, the step an earlier abort named, is
// not the plan's). It reports whether the job was re-ganged. The caller
// holds the job's lock.
func (c *Coordinator) regang(ctx context.Context, plan *coordpb.PlanRestoreResponse, stage string, aborted int64, target gangTarget, ev *coordpb.JobEvent) bool {
	job := plan.Job
	if ev.Sources == nil {
		ev.Sources = map[string]uint32{}
	}
	ev.Step, ev.Placement, ev.Skipped = plan.Step, target.placement, plan.Skipped
	if ev.PlannedUnixNano == 0 {
		ev.PlannedUnixNano = c.cfg.Clock.Now().UnixNano()
	}
	if len(plan.Skipped) > 0 {
		c.log.Warn("restore passed over steps that cannot be restored whole", "job", job, "step", plan.Step, "skipped", skippedText(plan.Skipped))
	}
	ev.RestoredUnixNano = c.cfg.Clock.Now().UnixNano()
	var problems []string
	for _, rp := range plan.Ranks {
		ev.Bytes += rp.Bytes
		kind, _, _ := strings.Cut(rp.Used, ":")
		if kind == "shm" && !strings.HasSuffix(rp.Used, ":"+rp.TargetNode) {
			kind = "shm:peer"
		}
		if rp.Used != "" {
			ev.Sources[kind]++
		}
		if rp.Error != "" {
			problems = append(problems, fmt.Sprintf("rank %d: %s", rp.Rank, rp.Error))
		}
	}
	if len(problems) > 0 || !plan.Ok {
		c.failRegang(ev, fmt.Errorf("coordinator: restore of %s step %d (nothing switched to it): %s", job, plan.Step, strings.Join(problems, "; ")))
		return false
	}
	if aborted != plan.Step {
		var err error
		if aborted < 0 { // an operator's restart: no abort yet
			_, err = c.raiseEpoch(ctx, job, plan.Step)
		} else { // the restore fell back past the step the abort named
			err = c.resumeEpochFrom(job, plan.Step)
		}
		if err != nil {
			_ = c.finishStage(context.WithoutCancel(ctx), plan, stage, false)
			c.failRegang(ev, err)
			return false
		}
		c.gangOrders(job, coordpb.OrderKind_ORDER_KIND_ABORT, plan.Step, ev.Reason)
	}
	if err := c.finishStage(ctx, plan, stage, true); err != nil {
		// The nodes that did switch hold one more copy of the step; those
		// that did not free what they staged.
		_ = c.finishStage(context.WithoutCancel(ctx), plan, stage, false)
		c.failRegang(ev, fmt.Errorf("coordinator: switching the ranks of %s to step %d: %w", job, plan.Step, err))
		return false
	}
	dropped, previous, err := c.moveJob(ctx, job, plan.Step, &target)
	if err != nil {
		c.failRegang(ev, err)
		return false
	}
	ev.WorldSize = target.worldSize
	if target.worldSize != previous {
		ev.PreviousWorldSize = previous
		ev.Reason += fmt.Sprintf("; %s: the job restarts at world size %d (was %d), every rank resharding step %d", target.why, target.worldSize, previous, plan.Step)
		c.noteWorldSize(job, target.worldSize, target.why)
		c.log.Warn("job's world size changed", "job", job, "world_size", target.worldSize, "was", previous, "why", target.why)
	}
	// The steps listed before the abort (RestartJob's), which the aborted
	// agents may have discarded already, and those deleted here.
	plan.DroppedSteps = slices.Compact(slices.Sorted(slices.Values(append(plan.DroppedSteps, dropped...))))
	if err := c.cfg.Faults.Check(ctx, faultinject.CoordBeforeRegang); err != nil {
		c.failRegang(ev, fmt.Errorf("coordinator: re-gang of %s step %d: %w", job, plan.Step, err))
		return false
	}
	ev.Ok = true
	c.unstall(job)
	c.mu.Lock()
	ev.Epoch, _ = c.jobEpochLocked(job)
	if c.reganged == nil {
		c.reganged = map[string]time.Time{}
	}
	c.reganged[job] = c.cfg.Clock.Now()
	c.mu.Unlock()
	c.gangOrders(job, coordpb.OrderKind_ORDER_KIND_RESUME, plan.Step, "")
	c.log.Info("job re-ganged", "job", job, "step", plan.Step, "node", ev.Node, "reason", ev.Reason,
		"plan_ms", (ev.PlannedUnixNano-ev.DetectedUnixNano)/1e6, "restore_ms", (ev.RestoredUnixNano-ev.PlannedUnixNano)/1e6,
		"bytes", ev.Bytes, "sources", fmt.Sprint(ev.Sources), "skipped", len(ev.Skipped))
	c.jobs.reganged(ev)
	c.watchers.publish(ev)
	return true
}

func (c *Coordinator) jobLock(job string) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.recovering == nil {
		c.recovering = map[string]*sync.Mutex{}
	}
	l := c.recovering[job]
	if l == nil {
		l = &sync.Mutex{}
		c.recovering[job] = l
	}
	return l
}

// replace returns the job's placement with the ranks of down nodes moved:
// to spare nodes first (live agents running none of the job's ranks),
// then to the live nodes of the job with the fewest ranks.
func (c *Coordinator) replace(job string) (map[uint32]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.state.Jobs[job]
	if j == nil {
		return nil, fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
	}
	out := maps.Clone(j.Placement)
	load := map[string]int{}
	for _, n := range slices.Sorted(maps.Keys(c.state.Nodes)) {
		if _, down := c.down[n]; !down {
			load[n] = 0
		}
	}
	for _, n := range j.Placement {
		if _, ok := load[n]; ok {
			load[n]++
		}
	}
	if len(load) == 0 {
		return nil, fmt.Errorf("%w: coordinator: job %s: no live node to run its ranks on", ErrRefused, job)
	}
	for _, r := range slices.Sorted(maps.Keys(j.Placement)) {
		if _, down := c.down[j.Placement[r]]; !down {
			continue
		}
		best := ""
		for _, n := range slices.Sorted(maps.Keys(load)) {
			if best == "" || load[n] < load[best] {
				best = n
			}
		}
		out[r] = best
		load[best]++
	}
	return out, nil
}

// moveJob records the target's placement and world size (0: the job's,
// which it sets) and deletes the job's steps after the one it resumes
// from: no rank will continue them, and a restore must never pick one,
// nor a later save of the same step number mix with them. It returns the
// steps deleted and the world size before.
func (c *Coordinator) moveJob(ctx context.Context, job string, step int64, target *gangTarget) (dropped []int64, previous uint32, err error) {
	var later []int64
	_, err = c.apply(func(ch *Changes) error {
		j := c.state.Jobs[job]
		if j == nil {
			return fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
		}
		previous = j.WorldSize
		if target.worldSize == 0 {
			target.worldSize = j.WorldSize
		}
		if _, err := c.state.RegisterJob(job, target.worldSize, target.placement, ch); err != nil {
			return err
		}
		for s := range j.Steps {
			if s > step {
				later = append(later, s)
			}
		}
		for r, l := range j.rankLatest {
			if l > step {
				j.rankLatest[r] = step
			}
		}
		ch.Sync = true
		return nil
	})
	if err != nil {
		return nil, previous, err
	}
	slices.Sort(later)
	for _, s := range later {
		_, err := c.DeleteStep(ctx, job, s, true)
		switch {
		case err == nil:
			dropped = append(dropped, s)
		case errors.Is(err, ErrNotFound): // gone meanwhile (the aborted agents discard later steps): as wanted
		default:
			c.log.Warn("deleting a step after the one the job resumes from", "job", job, "step", s, "err", err)
		}
	}
	return dropped, previous, nil
}

// recoveryDue reports whether a recovery of job for a death declared at
// declared is still due: a rank of the job is placed on a node declared
// down, or no re-gang of the job ended since (the node came back before
// its recovery ran: its ranks may have died with it).
func (c *Coordinator) recoveryDue(job string, declared time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.state.Jobs[job]
	if j == nil {
		return true // the recovery says so
	}
	for _, n := range j.Placement {
		if c.downLocked(n) {
			return true
		}
	}
	return c.reganged[job].Before(declared)
}

// downNodes returns the nodes declared down now.
func (c *Coordinator) downNodes() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]bool, len(c.down))
	for n := range c.down {
		out[n] = true
	}
	return out
}

// isDown reports whether node is declared dead.
func (c *Coordinator) isDown(node string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.downLocked(node)
}

// downLocked is isDown for a caller that holds c.mu.
func (c *Coordinator) downLocked(node string) bool {
	_, down := c.down[node]
	return down
}

// WatchJob streams a job's recovery events.
func (s *server) WatchJob(req *coordpb.WatchJobRequest, stream coordpb.Coordinator_WatchJobServer) error {
	ch, seq, cancel := s.c.watchers.watch(req.Job, req.Replay, req.AfterSeq)
	defer cancel()
	if err := stream.SendHeader(metadata.Pairs(coordpb.EventSeqHeader, strconv.FormatUint(seq, 10))); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case ev := <-ch:
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
}

// NodeDown declares a node dead.
func (s *server) NodeDown(ctx context.Context, req *coordpb.NodeDownRequest) (*coordpb.NodeDownResponse, error) {
	reason := req.Reason
	if reason == "" {
		reason = "declared down by an operator"
	}
	jobs, err := s.c.NodeDown(req.Node, reason)
	if err != nil {
		return nil, toStatus(err)
	}
	return &coordpb.NodeDownResponse{Jobs: jobs}, nil
}
