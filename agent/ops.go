package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/shm"
)

// PrepareResult says where a rank writes its next shard.
type PrepareResult struct {
	Slot    uint32
	Path    string
	Size    int64
	Token   uint64
	Resized bool
	// SegmentID names the segment file (its inode number), for a rank
	// that keeps it mapped between saves.
	SegmentID uint64
}

// maxShardBytes bounds one shard (16 TiB): beyond any node's memory, it only
// catches sizes computed from garbage.
const maxShardBytes = 16 << 40

// Prepare picks and sizes a slot for the rank's save of step. The slot
// holding the rank's latest committed step is never chosen, so a save that
// fails or dies half-way cannot damage it.
func (a *Agent) Prepare(ctx context.Context, job string, rank, worldSize uint32, step int64, size int64) (PrepareResult, error) {
	return a.prepare(ctx, job, rank, worldSize, step, size, true, false, a.epochs.get(job).epoch, false)
}

// PrepareAt is Prepare for a rank of the job's epoch (epoch.go): the
// save's shard records carry it, and a commit after the job left it is
// refused.
func (a *Agent) PrepareAt(ctx context.Context, job string, rank, worldSize uint32, step int64, size int64, epoch uint64) (PrepareResult, error) {
	return a.prepare(ctx, job, rank, worldSize, step, size, true, false, epoch, false)
}

// prepare is Prepare; place says the rank runs on this node (a save, a
// restore), as opposed to this node keeping a replica of another node's
// shard, which must not move the rank's placement.
//
// warm lets a new slot adopt the node's warm segment (warm.go): the caller
// fills it through warmMapping.
//
// copying says the agent itself fills the slot (a replica, a restore from
// a peer or a tier, under the rank's copyMu): no save takes the slot over
// while it is written, as one takes over a save it abandoned.
func (a *Agent) prepare(ctx context.Context, job string, rank, worldSize uint32, step int64, size int64, place, warm bool, epoch uint64, copying bool) (PrepareResult, error) {
	if err := validateRank(job, rank, worldSize); err != nil {
		return PrepareResult{}, err
	}
	if worldSize == 0 {
		return PrepareResult{}, fmt.Errorf("%w: agent: world size is 0", ErrInvalid)
	}
	if step < 0 {
		return PrepareResult{}, fmt.Errorf("%w: agent: negative step %d", ErrInvalid, step)
	}
	if size < shm.Alignment || size > maxShardBytes {
		return PrepareResult{}, fmt.Errorf("%w: agent: shard size %d bytes out of range [%d, %d]", ErrInvalid, size, shm.Alignment, int64(maxShardBytes))
	}
	r := a.rank(job, rank, true)
	r.mu.Lock()
	defer r.mu.Unlock()
	s, err := a.pickSlot(ctx, r, size, !place)
	if err != nil {
		return PrepareResult{}, err
	}
	adopted := warm && s.State == stateFree && s.Size == 0 && a.adoptWarm(a.paths.Segment(job, rank, s.Index), size)
	err = a.reserveBudget(job, rank, s.Size, size)
	if errors.Is(err, ErrBudget) && a.expirePrepares(r) > 0 { // saves never committed go first (prepares.go)
		err = a.reserveBudget(job, rank, s.Size, size)
	}
	if errors.Is(err, ErrBudget) && a.expirePartials() > 0 { // and reads whose reader is gone (partial.go)
		err = a.reserveBudget(job, rank, s.Size, size)
	}
	if errors.Is(err, ErrBudget) && place {
		err = a.makeRoom(r, s.Size, size, err)
	}
	if err != nil {
		if s.State == stateFree && s.Size == 0 { // a new slot: it never was
			r.slots = slices.DeleteFunc(r.slots, func(x *slot) bool { return x == s })
		}
		if adopted { // the warm segment is the next restore's again
			a.unadoptWarm(a.paths.Segment(job, rank, s.Index))
		}
		a.metrics.saves.WithLabelValues("budget").Inc()
		return PrepareResult{}, err
	}
	prev := *s
	// Record the slot as being written before its file changes, so that an
	// agent restarted mid-save never takes the old bytes for a checkpoint.
	s.State, s.Step, s.Seq, s.token, s.HeaderSum, s.Problem, s.verified, s.leaves = stateWriting, step, 0, newToken(), "", "", false, nil
	s.WorldSize, s.CommittedAt, s.Replica, s.Epoch, s.copying = worldSize, 0, !place, epoch, copying
	s.preparedAt = a.cfg.Clock.Now()
	if err := a.persist(&r.rankState); err != nil {
		*s = prev
		a.releaseBudget(job, prev.Size, size)
		return PrepareResult{}, err
	}
	path := a.paths.Segment(job, rank, s.Index)
	resized, segID, err := a.segs.ReserveID(path, size)
	if err != nil {
		var nospace *shm.NoSpaceError
		if errors.As(err, &nospace) {
			// Reserve left the file as it was: so is the slot.
			*s = prev
		} else {
			s.State = stateFree
			a.gone(&r.rankState, &prev) // its old step is gone: say so
		}
		a.releaseBudget(job, prev.Size, size)
		if perr := a.persist(&r.rankState); perr != nil {
			a.log.Error("restoring slot state after failed reserve", "err", perr)
		}
		a.metrics.saves.WithLabelValues("no_space").Inc()
		return PrepareResult{}, err
	}
	if size < prev.Size {
		a.adjustUsed(job, size-prev.Size)
	}
	s.Size = size
	if place {
		a.rep.registerJob(job, rank, worldSize, epoch)
	}
	if prev.State == stateCommitted || prev.State == stateCorrupt { // a corrupt one leaves the index too
		a.gone(&r.rankState, &prev)
		a.log.Debug("committed slot reused", "job", job, "rank", rank, "slot", s.Index, "step", prev.Step, "replica", prev.Replica,
			"for_step", step, "for_replica", !place, "pins", fmt.Sprint(a.rep.pinned(job)))
	}
	if resized {
		a.log.Info("segment sized", "job", job, "rank", rank, "slot", s.Index, "bytes", size)
	}
	return PrepareResult{Slot: s.Index, Path: path, Size: size, Token: s.token, Resized: resized, SegmentID: segID}, nil
}

// makeRoom frees replicas for a save of the node's own (rank r's segment
// growing from old to size bytes) that the budget refused with err, and
// reserves again: the job's own replicas first, then, while the node's
// budget is what is short, any job's. Other jobs' replicas never give way
// to a job short of its share (--job-budget): only its own count in it.
// The caller holds r.mu.
func (a *Agent) makeRoom(r *lockedRank, old, size int64, err error) error {
	for _, of := range []string{r.job, ""} {
		var share *jobBudgetError
		if of == "" && errors.As(err, &share) {
			return err
		}
		if a.evictReplicas(of, size-old, r) > 0 {
			if err = a.reserveBudget(r.job, r.rank, old, size); err == nil {
				return nil
			}
		}
	}
	return err
}

// releaseBudget undoes reserveBudget for a segment of job that did not
// grow.
func (a *Agent) releaseBudget(job string, old, size int64) {
	if size > old {
		a.adjustUsed(job, old-size)
	}
}

// Commit makes a prepared slot the rank's latest checkpoint, after checking
// that its header is whole and names this job, rank and step. Tensor data is
// verified in the background (VerifyAfterCommit), off the training step.
func (a *Agent) Commit(ctx context.Context, job string, rank, slotIdx uint32, token uint64, step int64, headerSum string) (uint64, error) {
	return a.commit(ctx, job, rank, slotIdx, token, step, headerSum, false)
}

// commit is Commit; verified says the caller checked every checksum of the
// slot's bytes as it wrote them (a copy from a peer), so the background
// pass would only read them again.
func (a *Agent) commit(ctx context.Context, job string, rank, slotIdx uint32, token uint64, step int64, headerSum string, verified bool) (uint64, error) {
	r, err := a.preparedRank(job, rank)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, h, err := a.checkWritten(ctx, r, slotIdx, token, step, headerSum)
	if err != nil {
		return 0, err
	}
	if cur := a.epochs.get(job); s.Epoch != 0 && s.Epoch < cur.epoch && s.Step > cur.step {
		a.metrics.saves.WithLabelValues("fenced").Inc()
		return 0, fmt.Errorf("%w: agent: rank %d of job %s belongs to epoch %d; the job is at epoch %d, which resumed from step %d: its save of step %d is not committed; this rank's gang was replaced, exit",
			ErrFenced, rank, job, s.Epoch, cur.epoch, cur.step, step)
	}
	prev := *s
	s.State, s.Seq, s.HeaderSum = stateCommitted, a.nextSeq(), headerSum
	s.CommittedAt, s.WorldSize, s.Tensors, s.token = a.cfg.Clock.Now().UnixNano(), h.Meta.WorldSize, uint32(len(h.Tensors)), 0
	s.verified = verified
	if err := a.persist(&r.rankState); err != nil {
		*s = prev // still being written by the same caller, who may retry
		return 0, err
	}
	if !verified { // a rank's own save, not a peer's copy
		a.metrics.saveSeconds.WithLabelValues(job).Observe(max(0, time.Unix(0, s.CommittedAt).Sub(s.preparedAt).Seconds()))
	}
	a.cfg.Faults.Eval(ctx, faultinject.AgentCommittedUnsent)
	a.committed(r, s)
	return s.Seq, nil
}

// committed tells the coordinator of a slot just committed, counts it, and
// queues its background verification; the caller holds r.mu.
func (a *Agent) committed(r *lockedRank, s *slot) {
	a.rep.shardOfEpoch(r.job, r.rank, s.WorldSize, s.Step, s.Size, s.HeaderSum, coordpb.CopyState_COPY_STATE_COMMITTED, s.Epoch)
	a.metrics.saves.WithLabelValues("ok").Inc()
	a.metrics.committedBytes.Add(float64(s.Size))
	if a.cfg.VerifyAfterCommit && a.verifyQ != nil && !s.verified {
		select {
		case a.verifyQ <- verifyJob{r: r, s: s, seq: s.Seq}:
		default: // the verifier is behind; the shard is verified when next read
		}
	}
}

// preparedRank returns the rank a commit or a staging names.
func (a *Agent) preparedRank(job string, rank uint32) (*lockedRank, error) {
	if err := validateRank(job, rank, 0); err != nil {
		return nil, err
	}
	r := a.rank(job, rank, false)
	if r == nil {
		return nil, fmt.Errorf("%w: agent: job %s rank %d has no prepared slot", ErrNotFound, job, rank)
	}
	return r, nil
}

// checkWritten returns the slot being written for step by the holder of
// token, once its header is whole and names this job, rank and step, and
// its checksum is headerSum; the caller holds r.mu.
func (a *Agent) checkWritten(ctx context.Context, r *lockedRank, slotIdx uint32, token uint64, step int64, headerSum string) (*slot, *shm.Header, error) {
	job, rank := r.job, r.rank
	var s *slot
	for _, c := range r.slots {
		if c.Index == slotIdx {
			s = c
		}
	}
	if s == nil || s.State != stateWriting || s.token != token || s.Step != step {
		return nil, nil, fmt.Errorf("%w: agent: slot %d of job %s rank %d is not being written for step %d by this caller (a later save took it over, or the prepare expired: --prepare-ttl)",
			ErrBusy, slotIdx, job, rank, step)
	}
	if err := a.cfg.Faults.Check(ctx, faultinject.AgentShardCopied); err != nil {
		return nil, nil, fmt.Errorf("agent: commit of job %s rank %d step %d: %w", job, rank, step, err)
	}
	h, raw, err := a.readHeader(a.paths.Segment(job, rank, slotIdx))
	if err != nil {
		return nil, nil, fmt.Errorf("agent: commit of job %s rank %d step %d: %w", job, rank, step, err)
	}
	switch {
	case !h.Rewind || h.Meta.Job != job || h.Meta.Rank != rank || h.Meta.Step != step:
		return nil, nil, fmt.Errorf("%w: agent: commit of job %s rank %d step %d: header names job %q rank %d step %d",
			ErrInvalid, job, rank, step, h.Meta.Job, h.Meta.Rank, h.Meta.Step)
	case h.Size != s.Size:
		return nil, nil, fmt.Errorf("%w: agent: commit: header describes %d bytes, segment is %d", ErrInvalid, h.Size, s.Size)
	case shm.HeaderSum(raw) != headerSum:
		return nil, nil, fmt.Errorf("%w: agent: commit of job %s rank %d step %d: header checksum %s, writer says %s",
			shm.ErrCorrupt, job, rank, step, shm.HeaderSum(raw), headerSum)
	}
	return s, h, nil
}

// pin holds a committed shard for an in-process reader (a stream): its slot
// is not reused until release is called, however long that takes. The shard
// is verified first, exactly the slot pinned.
func (a *Agent) pin(job string, rank uint32, step int64) (*shardInfo, func(), error) {
	return a.pinFor(job, rank, step, true)
}

// pinFor is pin; without verify the shard's bytes are not checked, for a
// reader that checks every one of them itself before anything is committed
// or restored from them (the peer data path's receiver).
func (a *Agent) pinFor(job string, rank uint32, step int64, verify bool) (*shardInfo, func(), error) {
	if err := validateRank(job, rank, 0); err != nil {
		return nil, nil, err
	}
	r := a.rank(job, rank, false)
	if r == nil {
		return nil, nil, fmt.Errorf("%w: agent: no checkpoint for job %s rank %d", ErrNotFound, job, rank)
	}
	r.mu.Lock()
	s := r.find(step)
	if s == nil || a.fencedSlot(job, s) {
		r.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: agent: no committed checkpoint for job %s rank %d at step %d", ErrNotFound, job, rank, step)
	}
	s.readers++
	info := a.shardOf(&r.rankState, s)
	r.mu.Unlock()
	release := func() {
		r.mu.Lock()
		s.readers--
		r.mu.Unlock()
	}
	if !verify {
		return info, release, nil
	}
	if err := a.verify(r, s); err != nil {
		release()
		return nil, nil, err
	}
	r.mu.Lock()
	info.Verified, info.Leaves = s.verified, s.leaves // what the verification found
	r.mu.Unlock()
	return info, release, nil
}

// Open leases a committed shard (the latest when latest is set) for reading.
func (a *Agent) Open(job string, rank uint32, step int64, latest bool) (*shardInfo, uint64, error) {
	if err := validateRank(job, rank, 0); err != nil {
		return nil, 0, err
	}
	r := a.rank(job, rank, false)
	if r == nil {
		return nil, 0, fmt.Errorf("%w: agent: no checkpoint for job %s rank %d", ErrNotFound, job, rank)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.latest()
	if !latest {
		s = r.find(step)
	}
	if s != nil && a.fencedSlot(job, s) {
		s = nil // a fenced epoch's save: discarded as soon as the epoch was learned
	}
	if s == nil {
		return nil, 0, fmt.Errorf("%w: agent: no committed checkpoint for job %s rank %d%s", ErrNotFound, job, rank, stepSuffix(step, latest))
	}
	id := newToken()
	s.readers++
	a.mu.Lock()
	a.leases[id] = &lease{r: r, s: s, expires: a.cfg.Clock.Now().Add(a.cfg.LeaseTTL)}
	a.mu.Unlock()
	return a.shardOf(&r.rankState, s), id, nil
}

func stepSuffix(step int64, latest bool) string {
	if latest {
		return ""
	}
	return fmt.Sprintf(" at step %d", step)
}

// Release ends a lease; releasing an unknown or expired lease is not an error.
func (a *Agent) Release(id uint64) {
	if a.releasePartial(id) {
		return
	}
	a.mu.Lock()
	l := a.leases[id]
	delete(a.leases, id)
	a.mu.Unlock()
	if l == nil {
		return
	}
	l.r.mu.Lock()
	l.s.readers--
	l.r.mu.Unlock()
}

// expireLeases drops the leases of rank r that are past their TTL, so a
// reader that died without releasing does not pin a slot forever. The caller
// holds r's mutex.
func (a *Agent) expireLeases(r *lockedRank) {
	now := a.cfg.Clock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, l := range a.leases {
		if l.r == r && now.After(l.expires) {
			a.log.Warn("read lease expired without release", "job", r.job, "rank", r.rank, "step", l.s.Step)
			l.s.readers--
			delete(a.leases, id)
		}
	}
}

// List returns every non-free slot, of one job or of all, ordered by job,
// rank and step.
func (a *Agent) List(job string) []*shardInfo {
	ranks := a.rankList(job)
	var out []*shardInfo
	for _, r := range ranks {
		r.mu.Lock()
		for _, s := range r.slots {
			if s.State != stateFree {
				out = append(out, a.shardOf(&r.rankState, s))
			}
		}
		r.mu.Unlock()
	}
	slices.SortFunc(out, func(x, y *shardInfo) int {
		switch {
		case x.Job != y.Job:
			return compare(x.Job, y.Job)
		case x.Rank != y.Rank:
			return compare(x.Rank, y.Rank)
		}
		return compare(x.Step, y.Step)
	})
	return out
}

func compare[T int64 | uint32 | string](x, y T) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// Delete removes the committed or corrupt shards of a job: of one rank or
// all, of one step or every step (step < 0). Slots being read or written are
// left alone.
func (a *Agent) Delete(job string, rank uint32, allRanks bool, step int64) (n int, freed int64, err error) {
	if err := validateRank(job, rank, 0); err != nil {
		return 0, 0, err
	}
	a.mu.Lock()
	var ranks []*lockedRank
	for k, r := range a.ranks {
		if k.job == job && (allRanks || k.rank == rank) {
			ranks = append(ranks, r)
		}
	}
	a.mu.Unlock()
	for _, r := range ranks {
		r.mu.Lock()
		var removed []*slot
		keep := r.slots[:0]
		for _, s := range r.slots {
			gone := (s.State == stateCommitted || s.State == stateCorrupt || s.State == stateFree) &&
				s.readers == 0 && (step < 0 || s.Step == step && s.State != stateFree)
			if !gone {
				keep = append(keep, s)
				continue
			}
			if rmErr := a.cfg.FS.Remove(a.paths.Segment(r.job, r.rank, s.Index)); rmErr != nil && !os.IsNotExist(rmErr) {
				err = errors.Join(err, rmErr)
				keep = append(keep, s)
				continue
			}
			if s.State != stateFree {
				n++
			}
			removed = append(removed, s)
			freed += s.Size
			a.adjustUsed(r.job, -s.Size)
		}
		r.slots = keep
		for _, s := range removed { // once the slots left: a twin being read stays
			a.gone(&r.rankState, s)
		}
		if perr := a.persist(&r.rankState); perr != nil {
			err = errors.Join(err, perr)
		}
		r.mu.Unlock()
	}
	if n > 0 {
		a.log.Info("deleted shards", "job", job, "shards", n, "bytes", freed)
	}
	return n, freed, err
}

// Verify re-reads a committed (or already corrupt) shard and checks every
// checksum. A mismatch marks the slot corrupt: it is never served again.
func (a *Agent) Verify(job string, rank uint32, step int64, detail string) (int64, error) {
	if err := validateRank(job, rank, 0); err != nil {
		return 0, err
	}
	r := a.rank(job, rank, false)
	if r == nil {
		return 0, fmt.Errorf("%w: agent: no checkpoint for job %s rank %d", ErrNotFound, job, rank)
	}
	r.mu.Lock()
	var s *slot
	for _, c := range r.slots {
		if (c.State == stateCommitted || c.State == stateCorrupt) && c.Step == step && (s == nil || c.Seq > s.Seq) {
			s = c
		}
	}
	r.mu.Unlock()
	if s == nil {
		return 0, fmt.Errorf("%w: agent: no checkpoint for job %s rank %d at step %d", ErrNotFound, job, rank, step)
	}
	if detail != "" {
		a.log.Warn("reader reports corrupt shard", "job", job, "rank", rank, "step", step, "detail", detail)
	}
	return s.Size, a.verify(r, s)
}
