package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/shm"
)

// verify checks a slot's bytes without holding the rank's mutex during the
// pass over the data (a save of the same rank must not wait for it): the
// slot is pinned as being read meanwhile, and the result is applied only if
// the slot still holds the same commit.
func (a *Agent) verify(r *lockedRank, s *slot) error {
	r.mu.Lock()
	for s.verifying != nil { // one pass at a time per slot
		done := s.verifying
		r.mu.Unlock()
		<-done
		r.mu.Lock()
	}
	if s.State != stateCommitted && s.State != stateCorrupt {
		r.mu.Unlock()
		return fmt.Errorf("%w: agent: job %s rank %d slot %d is no longer committed", ErrNotFound, r.job, r.rank, s.Index)
	}
	snap := *s
	done := make(chan struct{})
	s.verifying = done
	r.mu.Unlock()

	start := time.Now()
	leaves, err := a.checkSegment(r.job, r.rank, &snap)
	a.metrics.verifySeconds.Observe(time.Since(start).Seconds())

	r.mu.Lock()
	defer r.mu.Unlock()
	s.verifying = nil
	close(done)
	if s.Seq != snap.Seq {
		return err
	}
	if err == nil {
		if s.State == stateCorrupt {
			return fmt.Errorf("%w: agent: job %s rank %d step %d was found corrupt earlier: %s", shm.ErrCorrupt, r.job, r.rank, s.Step, s.Problem)
		}
		s.verified, s.leaves = true, leaves
		return nil
	}
	if !errors.Is(err, shm.ErrCorrupt) {
		// Not the bytes' fault (too many open files, no memory to map):
		// the shard keeps its state and the caller sees the error.
		a.log.Warn("could not verify a shard", "job", r.job, "rank", r.rank, "step", s.Step, "err", err)
		return err
	}
	was := s.State
	s.State, s.Problem, s.verified, s.leaves = stateCorrupt, err.Error(), false, nil
	if was != stateCorrupt {
		a.log.Error("checkpoint corrupt: it will not be served", "job", r.job, "rank", r.rank, "step", s.Step, "err", err)
		a.metrics.corrupt.Inc()
		a.rep.shard(r.job, r.rank, s.WorldSize, s.Step, s.Size, s.HeaderSum, coordpb.CopyState_COPY_STATE_CORRUPT)
		// The coordinator drops the node's copy of the step whatever its
		// checksum: another slot of this step (a save made twice) is one.
		if o := r.find(s.Step); o != nil {
			a.rep.shardOfEpoch(r.job, r.rank, o.WorldSize, o.Step, o.Size, o.HeaderSum, coordpb.CopyState_COPY_STATE_COMMITTED, o.Epoch)
		}
	}
	if perr := a.persist(&r.rankState); perr != nil {
		a.log.Error("recording corrupt shard", "err", perr)
	}
	return err
}

// checkSegment reads a segment and checks header and data, and returns
// the leaf hashes of its tensors.
func (a *Agent) checkSegment(job string, rank uint32, s *slot) (*tensorLeaves, error) {
	path := a.paths.Segment(job, rank, s.Index)
	f, err := a.cfg.FS.OpenFile(path, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: agent: segment of job %s rank %d step %d is gone: %v", shm.ErrCorrupt, job, rank, s.Step, err)
	}
	if err != nil {
		return nil, fmt.Errorf("agent: opening segment of job %s rank %d step %d: %w", job, rank, s.Step, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() != s.Size || fi.Size() < 8 {
		return nil, fmt.Errorf("%w: agent: segment of job %s rank %d step %d is %d bytes, %d were committed", shm.ErrCorrupt, job, rank, s.Step, fi.Size(), s.Size)
	}
	// Read, not mapped: a mapping's page table costs more than the copy.
	h, raw, err := shm.ReadHeader(f, fi.Size())
	if err != nil {
		return nil, fmt.Errorf("agent: job %s rank %d step %d: %w", job, rank, s.Step, err)
	}
	if !h.Rewind || h.Meta.Job != job || h.Meta.Rank != rank || h.Meta.Step != s.Step {
		return nil, fmt.Errorf("%w: agent: segment of job %s rank %d step %d holds job %q rank %d step %d",
			shm.ErrCorrupt, job, rank, s.Step, h.Meta.Job, h.Meta.Rank, h.Meta.Step)
	}
	if s.HeaderSum != "" && shm.HeaderSum(raw) != s.HeaderSum {
		return nil, fmt.Errorf("%w: agent: header of job %s rank %d step %d changed since commit", shm.ErrCorrupt, job, rank, s.Step)
	}
	hashes, err := h.VerifyAtLeaves(f, a.cfg.VerifyWorkers)
	if err != nil {
		return nil, fmt.Errorf("agent: job %s rank %d step %d: %w", job, rank, s.Step, err)
	}
	l := &tensorLeaves{names: make([]string, len(h.Tensors)), hashes: hashes}
	for i, t := range h.Tensors {
		l.names[i] = t.Name
	}
	return l, nil
}

type verifyJob struct {
	r   *lockedRank
	s   *slot
	seq uint64
}

// runVerifier verifies committed shards in the background until ctx ends.
func (a *Agent) runVerifier(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-a.verifyQ:
			j.r.mu.Lock()
			due := j.s.State == stateCommitted && j.s.Seq == j.seq && !j.s.verified
			j.r.mu.Unlock()
			if due {
				_ = a.verify(j.r, j.s)
			}
		}
	}
}
