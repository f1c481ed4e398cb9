package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// A restore is all or nothing (DESIGN invariant 8). The coordinator has
// every rank's node fetch the rank's shard with a stage, the restore's
// id: the shard is written into a fresh slot, as a save's would be (never
// the rank's latest checkpoint, nor a step the job's pins hold), and
// verified, but the slot is left staged: not served, not reported, not
// the rank's checkpoint. Once every rank is staged the coordinator
// switches them all (FinishRestore with commit): each staged slot is
// committed as a save's commit would be. If any rank could not be staged,
// it frees them instead, and every node's memory is as it was.
//
// A staged slot whose restore never finishes (its coordinator died) is
// given up after stageTTL, by the next save that needs a slot, and an
// agent restarted meanwhile frees it (reindex keeps only committed and
// corrupt slots).

// stageTTL is how long a staged slot waits for its restore to finish.
// A restore stages every rank before it switches them: the slowest rank's
// fetch from the object store bounds it, well under this.
const stageTTL = 30 * time.Minute

// stage marks a slot written for a restore as staged for it, after the
// checks a commit makes. verified says every checksum of its bytes was
// checked as they were written.
func (a *Agent) stage(ctx context.Context, ps PeerShard, slotIdx uint32, token uint64, verified bool) error {
	r, err := a.preparedRank(ps.Job, ps.Rank)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, h, err := a.checkWritten(ctx, r, slotIdx, token, ps.Step, ps.HeaderSum)
	if err != nil {
		return err
	}
	prev := *s
	s.State, s.Stage, s.HeaderSum, s.stagedAt = stateStaged, ps.Stage, ps.HeaderSum, a.cfg.Clock.Now()
	s.WorldSize, s.Tensors, s.token, s.verified, s.leaves = h.Meta.WorldSize, uint32(len(h.Tensors)), 0, verified, nil
	if err := a.persist(&r.rankState); err != nil {
		*s = prev
		return err
	}
	return nil
}

// staged reports whether ps's shard is staged for ps.Stage.
func (a *Agent) staged(ps PeerShard) bool {
	r := a.rank(ps.Job, ps.Rank, false)
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.slots {
		if s.State == stateStaged && s.Stage == ps.Stage && s.Step == ps.Step && s.HeaderSum == ps.HeaderSum {
			return true
		}
	}
	return false
}

// FinishRestore ends the staging of a restore of job on this node: with
// commit every slot staged for stage is committed (and reported), as a
// save's commit is; without, they are freed. It returns how many.
func (a *Agent) FinishRestore(job, stage string, commit bool) (int, error) {
	if err := validateRank(job, 0, 0); err != nil {
		return 0, err
	}
	if stage == "" {
		return 0, fmt.Errorf("%w: agent: finishing a restore of job %s without its stage", ErrInvalid, job)
	}
	a.mu.Lock()
	var ranks []*lockedRank
	for k, r := range a.ranks {
		if k.job == job {
			ranks = append(ranks, r)
		}
	}
	a.mu.Unlock()
	n := 0
	var errs []error
	for _, r := range ranks {
		k, err := a.finishRank(r, stage, commit)
		n += k
		if err != nil {
			errs = append(errs, err)
		}
	}
	if n > 0 {
		a.log.Info("restore finished on this node", "job", job, "stage", stage, "committed", commit, "shards", n)
	}
	return n, errors.Join(errs...)
}

func (a *Agent) finishRank(r *lockedRank, stage string, commit bool) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var done []*slot
	for _, s := range r.slots {
		if s.State != stateStaged || s.Stage != stage {
			continue
		}
		s.Stage, s.stagedAt = "", time.Time{}
		if commit {
			s.State, s.Seq, s.CommittedAt = stateCommitted, a.nextSeq(), a.cfg.Clock.Now().UnixNano()
		} else {
			s.State = stateFree
		}
		done = append(done, s)
	}
	if len(done) == 0 {
		return 0, nil
	}
	if err := a.persist(&r.rankState); err != nil {
		// Not recorded: the slots are free again, whatever was asked, so
		// that a committed slot is never one the record does not hold.
		for _, s := range done {
			s.State, s.Seq, s.CommittedAt = stateFree, 0, 0
		}
		return 0, fmt.Errorf("agent: finishing the restore of job %s rank %d: %w", r.job, r.rank, err)
	}
	if commit {
		for _, s := range done {
			a.committed(r, s)
		}
	}
	return len(done), nil
}

// expireStaged frees rank r's staged slots whose restore has not finished
// within stageTTL; the caller holds r's mutex.
func (a *Agent) expireStaged(r *lockedRank) {
	now := a.cfg.Clock.Now()
	for _, s := range r.slots {
		if s.State == stateStaged && now.Sub(s.stagedAt) > stageTTL {
			a.log.Warn("a restore's staged shard was never switched to nor dropped: its slot is freed", "job", r.job, "rank", r.rank,
				"step", s.Step, "stage", s.Stage)
			s.State, s.Stage = stateFree, ""
		}
	}
}

// fetchFailure classifies why a source of a fetch did not serve.
func fetchFailure(err error) agentpb.FetchFailure {
	var nospace *shm.NoSpaceError
	switch {
	case errors.Is(err, shm.ErrCorrupt):
		return agentpb.FetchFailure_FETCH_FAILURE_CORRUPT
	case errors.Is(err, ErrBudget), errors.Is(err, ErrBusy), errors.As(err, &nospace):
		return agentpb.FetchFailure_FETCH_FAILURE_NO_ROOM
	case errors.Is(err, errStoreFailed):
		return agentpb.FetchFailure_FETCH_FAILURE_UNREACHABLE
	}
	return agentpb.FetchFailure_FETCH_FAILURE_UNAVAILABLE
}

// errStoreFailed marks a tier copy that could not be read for a reason
// that says nothing of the copy: its store did not answer or failed the
// request (a network error, a timeout, a server error, an I/O error).
// Such a copy may be whole, and a restore that marked its step
// unrestorable for it would lose a good step to an outage.
var errStoreFailed = errors.New("the store did not serve the copy")

// storeFailure marks err, a tier copy's fetch failure, with errStoreFailed
// unless fetchFailure already tells it apart (corrupt, no room), it says
// the copy is not there or was asked for wrongly, or the fetch was
// called off.
func storeFailure(ctx context.Context, err error) error {
	switch {
	case err == nil, ctx.Err() != nil, fetchFailure(err) != agentpb.FetchFailure_FETCH_FAILURE_UNAVAILABLE,
		tiers.IsNotExist(err), errors.Is(err, ErrNotFound), errors.Is(err, ErrInvalid):
		return err
	}
	return fmt.Errorf("%w: %w", errStoreFailed, err)
}

// dropPrepared frees a slot prepared for a copy into this node (a restore,
// a replica) that failed: the slot holds nothing, rather than an
// unfinished save (the segment stays, for the next save).
func (a *Agent) dropPrepared(job string, rank uint32, prep PrepareResult) {
	r := a.rank(job, rank, false)
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.slots {
		if s.Index == prep.Slot && s.State == stateWriting && s.token == prep.Token {
			s.State, s.token = stateFree, 0
			if err := a.persist(&r.rankState); err != nil {
				a.log.Warn("freeing the slot of a failed copy", "job", job, "rank", rank, "err", err)
			}
			return
		}
	}
}
