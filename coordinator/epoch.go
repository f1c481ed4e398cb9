package coordinator

import (
	"context"
	"errors"
	"fmt"

	"rewind.dev/rewind/api/coordpb"
)

// Fencing (docs/design/20261125_fencing.md): every gang of a job has an
// epoch. The coordinator raises it, durably, at each re-gang (a recovery,
// an operator's restart) before it tells any agent, and every save a rank
// makes carries the epoch its agent gave it. A save of an epoch the job
// has left, of a step past the one the next epoch resumed from, is of a
// timeline nobody will continue: it is refused, here and at the agents,
// which is what stops a rank cut off by a partition from writing into
// the recovered job when the partition heals. This is the fencing token
// of a lease (Chubby's sequencer, etcd's revision).

// ErrFenced is returned for a save, report or registration of an epoch
// the job has left.
var ErrFenced = errors.New("fenced")

// EpochStart is one of a job's epochs and the step it resumed from (-1:
// the job's first).
type EpochStart struct {
	Epoch uint64 `json:"epoch"`
	Step  int64  `json:"step"`
}

// maxEpochHistory bounds the epochs a job remembers: a record of an epoch
// older than the oldest kept is held to the lowest start kept, which only
// refuses more.
const maxEpochHistory = 256

// epochStep is the step the job's current epoch resumed from.
func (j *Job) epochStep() int64 {
	if n := len(j.Epochs); n > 0 {
		return j.Epochs[n-1].Step
	}
	return -1
}

// epochOf returns the job's epoch, 1 for a job that was never re-ganged.
func (j *Job) epochOf() uint64 { return max(j.Epoch, 1) }

// keptUpTo returns the newest step that epoch e's timeline shares with
// the job's current one: the lowest step a later epoch resumed from. A
// step of e after it was left behind by a re-gang.
func (j *Job) keptUpTo(e uint64) int64 {
	kept := int64(-1) << 62
	first := true
	for _, s := range j.Epochs {
		if s.Epoch > e && (first || s.Step < kept) {
			kept, first = s.Step, false
		}
	}
	if first {
		return 1<<62 - 1 // no later epoch: e is current
	}
	return kept
}

// checkEpoch refuses a committed copy that a rank of an epoch the job has
// left saved after the step the timeline went on from, and a copy of a
// step that another epoch saved. Epoch 0 is a copy not made by a rank's
// save (a tier copy, a replica, a restore an agent made before it knew
// the job's epoch): the coordinator ordered it from a copy it recorded.
func (j *Job) checkEpoch(rec Record) error {
	cur := j.epochOf()
	if rec.Epoch == 0 || rec.Epoch > cur {
		return nil // newer: this coordinator lost its index (adoptEpoch)
	}
	if rec.Epoch < cur && rec.Step > j.keptUpTo(rec.Epoch) {
		return fmt.Errorf("%w: coordinator: job %s rank %d step %d was saved by epoch %d; the job is at epoch %d, which resumed from step %d",
			ErrFenced, j.ID, rec.Rank, rec.Step, rec.Epoch, cur, j.keptUpTo(rec.Epoch))
	}
	if st := j.Steps[rec.Step]; st != nil && st.Epoch != 0 && st.Epoch != rec.Epoch && rec.Step > j.startOf(rec.Epoch) {
		return fmt.Errorf("%w: coordinator: job %s step %d holds shards of epoch %d; rank %d's of epoch %d cannot join them",
			ErrFenced, j.ID, rec.Step, st.Epoch, rec.Rank, rec.Epoch)
	}
	return nil
}

// leftBehind reports whether step st, which a rank of the job's current
// epoch now commits, holds a timeline the job left: its copies are of an
// older epoch, past the step a later epoch resumed from. A re-gang deletes
// such steps, but a copy on a node that was down stays in the index (its
// deletion failed); the current epoch's save of the step number takes
// its place rather than being refused for joining another epoch's step.
func (j *Job) leftBehind(st *Step, rec Record) bool {
	return st.Epoch != 0 && rec.Epoch != 0 && rec.Epoch == j.epochOf() && st.Epoch < rec.Epoch && st.Step > j.keptUpTo(st.Epoch)
}

// latestAnswer is the latest consistent step the coordinator answers: the
// job's, unless a re-gang left it behind (a step of an older epoch past
// the one the current epoch resumed from, not deleted yet while the
// re-gang runs): then the step the current epoch resumed from. A step
// left behind is of a timeline nobody continues; answering it would make
// the latest step go back once the re-gang deletes it.
func (j *Job) latestAnswer() int64 {
	st := j.Steps[j.Latest]
	if st != nil && st.Epoch != 0 && st.Epoch < j.epochOf() && st.Step > j.keptUpTo(st.Epoch) {
		return j.epochStep()
	}
	return j.Latest
}

// startOf returns the step epoch e resumed from (-1 for the first, or one
// no longer remembered).
func (j *Job) startOf(e uint64) int64 {
	for _, s := range j.Epochs {
		if s.Epoch == e {
			return s.Step
		}
	}
	return -1
}

// noteEpoch records on a step the epoch of the rank that saved it, when
// the step is that epoch's own (after the step it resumed from).
func (j *Job) noteEpoch(st *Step, rec Record, ch *Changes) {
	if rec.Epoch == 0 || st.Epoch != 0 || rec.Step <= j.startOf(rec.Epoch) {
		return
	}
	st.Epoch = rec.Epoch
	ch.Steps = append(ch.Steps, st)
}

// adoptEpoch raises the job's epoch to e, which an agent was told by a
// coordinator whose index this one does not have (a lost store): epochs
// never go back.
func (j *Job) adoptEpoch(e uint64, step int64, ch *Changes) {
	if e <= j.epochOf() {
		return
	}
	j.Epoch = e
	j.Epochs = append(j.Epochs, EpochStart{Epoch: e, Step: step})
	if len(j.Epochs) > maxEpochHistory {
		j.Epochs = j.Epochs[len(j.Epochs)-maxEpochHistory:]
	}
	ch.Jobs = append(ch.Jobs, j)
	ch.Sync = true
}

// raiseEpoch starts a new epoch of job, resuming from step, and stores it
// (synced) before returning: no agent hears of the new gang before the
// fence is durable.
func (c *Coordinator) raiseEpoch(ctx context.Context, job string, step int64) (uint64, error) {
	var epoch uint64
	_, err := c.apply(func(ch *Changes) error {
		j := c.state.Jobs[job]
		if j == nil {
			return fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
		}
		j.Epoch = j.epochOf() + 1
		j.Epochs = append(j.Epochs, EpochStart{Epoch: j.Epoch, Step: step})
		if len(j.Epochs) > maxEpochHistory {
			j.Epochs = j.Epochs[len(j.Epochs)-maxEpochHistory:]
		}
		epoch = j.Epoch
		ch.Jobs = append(ch.Jobs, j)
		ch.Sync = true
		return nil
	})
	if err == nil {
		c.log.Info("job epoch raised", "job", job, "epoch", epoch, "resumes_from", step)
	}
	return epoch, err
}

// resumeEpochFrom moves the step the job's current epoch resumes from to
// step, older than the one raiseEpoch named: the restore fell back.
func (c *Coordinator) resumeEpochFrom(job string, step int64) error {
	_, err := c.apply(func(ch *Changes) error {
		j := c.state.Jobs[job]
		if j == nil || len(j.Epochs) == 0 {
			return fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
		}
		j.Epochs[len(j.Epochs)-1].Step = step
		ch.Jobs = append(ch.Jobs, j)
		ch.Sync = true
		return nil
	})
	return err
}

// jobEpoch returns the job's epoch and the step it resumed from; the
// caller holds c.mu.
func (c *Coordinator) jobEpochLocked(job string) (uint64, int64) {
	if j := c.state.Jobs[job]; j != nil {
		return j.epochOf(), j.epochStep()
	}
	return 0, -1
}

// adoptEpochs raises each job's epoch to the one node's agent, registering,
// says it was told, where that is newer than what this coordinator knows
// (its index lost, or a standby's behind): the fence never goes back. An
// agent's word raises a fence only where it could be true: from a node
// one of the job's ranks is placed on, at any time (all of a job's nodes
// may come back after this coordinator caught up: were their epoch not
// adopted, its next recovery would raise the epoch to one the agents
// already passed, and fence nothing); from a node that holds a copy of
// the job, or whose inventory in this registration (claimed) names it, only
// while this coordinator catches up with the agents (rebuild.go: after
// it starts or begins to lead), as a gang re-formed on other nodes than
// the index knows registers. The epoch is adopted before the inventory
// is applied, so that its records do not join a step of the stale epoch.
// Otherwise any node could fence any job: its ranks' saves refused, its
// agents deleting its steps past the adopted epoch's start.
func (c *Coordinator) adoptEpochs(node string, told []*coordpb.Pin, claimed map[string]bool) error {
	_, err := c.apply(func(ch *Changes) error {
		c.noteLeadLocked()
		catchingUp := c.catchingUpLocked()
		for _, p := range told {
			j := c.state.Jobs[p.Job]
			if j == nil || p.Epoch <= j.epochOf() {
				continue
			}
			if !placed(node, j) && !(catchingUp && (claimed[p.Job] || c.state.JobsOn(node)[j.ID])) {
				c.log.Warn("an agent names a newer epoch of a job, which it cannot know here; not adopted",
					"node", node, "job", p.Job, "epoch", p.Epoch, "index_epoch", j.epochOf(), "catching_up", catchingUp)
				continue
			}
			c.log.Warn("an agent knows a newer epoch of a job than this coordinator's index; adopting it",
				"node", node, "job", p.Job, "epoch", p.Epoch, "index_epoch", j.epochOf())
			j.adoptEpoch(p.Epoch, p.EpochStep, ch)
		}
		return nil
	})
	return err
}

// placed reports whether one of j's ranks is placed on node.
func placed(node string, j *Job) bool {
	for _, n := range j.Placement {
		if n == node {
			return true
		}
	}
	return false
}

// takesPartLocked reports whether node runs one of j's ranks or holds a
// copy of its shards. The caller holds c.mu.
func (c *Coordinator) takesPartLocked(node string, j *Job) bool {
	return c.state.JobsOn(node)[j.ID] || placed(node, j)
}
