package agent

import (
	"errors"
	"fmt"
	"sync"
)

// Fencing, the agent's part (docs/design/20261125_fencing.md). The
// coordinator raises a job's epoch at every re-gang and tells agents in
// gang orders and pins. A rank learns its epoch from the answer to its
// first save and names it in every save after; a rank of an epoch the
// job has left is refused with ErrFenced, which wraps ErrGangBroken, so
// both SDKs already make the rank exit. An agent that learns of a newer
// epoch from pins, not from the abort (its node was cut off while the
// job was recovered), discards the saves its old ranks made after the
// step the new epoch resumed from: nobody continues them.

// ErrFenced is returned to a rank of an epoch its job has left.
var ErrFenced = fmt.Errorf("%w: fenced", ErrGangBroken)

// epochs holds the newest epoch this agent was told of each job.
type epochs struct {
	mu   sync.Mutex
	jobs map[string]epochStart
}

// epochStart is an epoch and the step it resumed from (-1: the job's
// first).
type epochStart struct {
	epoch uint64
	step  int64
}

// get returns the job's epoch as this agent knows it (0: not told).
func (e *epochs) get(job string) epochStart {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.jobs[job]; ok {
		return s
	}
	return epochStart{step: -1}
}

// raise records epoch for job unless a newer one is known (the same one
// may name another step: a restore that fell back); it returns the epoch
// known before and whether epoch is newer.
func (e *epochs) raise(job string, epoch uint64, step int64) (epochStart, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.jobs[job]
	if epoch == old.epoch && epoch != 0 {
		e.jobs[job] = epochStart{epoch: epoch, step: step}
	}
	if epoch <= old.epoch {
		return old, false
	}
	if e.jobs == nil {
		e.jobs = map[string]epochStart{}
	}
	e.jobs[job] = epochStart{epoch: epoch, step: step}
	return old, true
}

// checkEpoch returns the epoch a rank saving with epoch (0: its first
// save) belongs to, or ErrFenced when the job has left it.
func (a *Agent) checkEpoch(job string, rank uint32, epoch uint64) (uint64, error) {
	cur := a.epochs.get(job)
	if epoch != 0 && epoch < cur.epoch {
		a.metrics.saves.WithLabelValues("fenced").Inc()
		return 0, fmt.Errorf("%w: agent: rank %d of job %s belongs to epoch %d; the job is at epoch %d, which resumed from step %d: this rank's gang was replaced, exit",
			ErrFenced, rank, job, epoch, cur.epoch, cur.step)
	}
	return max(epoch, cur.epoch), nil
}

// learnEpoch applies a job's epoch told by pins. An epoch newer than this
// agent knew means it missed the re-gang that raised it: the saves its
// ranks of older epochs made after the new epoch's step are discarded,
// and those ranks are refused from their next call.
func (a *Agent) learnEpoch(job string, epoch uint64, step int64) {
	old, newer := a.epochs.raise(job, epoch, step)
	if !newer {
		return
	}
	if old.epoch != 0 { // else the first this agent hears (a restart): its slots still say their epochs
		a.log.Warn("job moved to a newer epoch while this node was not told (cut off): fencing its old ranks",
			"job", job, "epoch", epoch, "was", old.epoch, "resumes_from", step)
	}
	a.discardFenced(job, epoch, step)
}

// fencedSlot reports whether s holds a save of an epoch the job has
// left, past the step its current epoch resumed from: never served, as
// nobody continues that timeline. The caller holds the rank's lock.
func (a *Agent) fencedSlot(job string, s *slot) bool {
	cur := a.epochs.get(job)
	return s.Epoch != 0 && s.Epoch < cur.epoch && s.Step > cur.step
}

// discardFenced deletes the job's shards on this node that ranks of an
// epoch before epoch committed after step.
func (a *Agent) discardFenced(job string, epoch uint64, step int64) {
	n := 0
	for _, sh := range a.List(job) {
		if sh.State != stateCommitted || sh.Step <= step || sh.Epoch == 0 || sh.Epoch >= epoch {
			continue
		}
		_, _, err := a.Delete(job, sh.Rank, false, sh.Step)
		if err != nil && !errors.Is(err, ErrNotFound) {
			a.log.Warn("discarding a fenced save", "job", job, "rank", sh.Rank, "step", sh.Step, "err", err)
			continue
		}
		n++
	}
	if n > 0 {
		a.log.Warn("discarded saves of a fenced epoch", "job", job, "epoch", epoch, "after_step", step, "shards", n)
	}
}
