package chaos

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// OpKind is what a client of the cluster saw.
type OpKind int

const (
	// OpSave: a rank's Save of Step was acknowledged.
	OpSave OpKind = iota + 1
	// OpLatest: the coordinator answered Latest with Step (-1: none),
	// the job at Epoch, which resumed from EpochStep.
	OpLatest
	// OpRestore: a restore landed the job on Step. Newest is the newest
	// step restorable at that moment as the client saw it (-1: not
	// known); Named the step an operator asked for (-1: none); Skipped
	// the newer steps the coordinator reported it passed over.
	OpRestore
	// OpListing: the coordinator's list of the job's steps. Steps are
	// those it can restore (consistent, a copy of every rank); Durable
	// maps a shared tier to the steps durable on it.
	OpListing
	// OpRemoved: Step was removed on purpose (an operator's delete),
	// Why says by whom.
	OpRemoved
	// OpResumed: a rank restored Step and trains on from it.
	OpResumed
)

func (k OpKind) String() string {
	switch k {
	case OpSave:
		return "save"
	case OpLatest:
		return "latest"
	case OpRestore:
		return "restore"
	case OpListing:
		return "listing"
	case OpRemoved:
		return "removed"
	case OpResumed:
		return "resumed"
	}
	return fmt.Sprintf("op(%d)", int(k))
}

// Op is one timestamped observation of one client.
type Op struct {
	At time.Time
	// Done, for a restore: when its client saw it finished. Until then
	// the job's later steps may still be answered and listed; they are
	// the restore's to delete.
	Done    time.Time
	Client  string // "rank 1", "latest poller", "recovery", "operator"
	Job     string
	Kind    OpKind
	Rank    int
	Step    int64
	Newest  int64
	Named   int64
	Skipped []int64
	Steps   []int64
	Durable map[string][]int64
	Why     string
	// Epoch and EpochStep, for a Latest answer: the job's epoch and the
	// step it resumed from (0, -1: not known).
	Epoch     uint64
	EpochStep int64
}

func (o Op) String() string {
	return fmt.Sprintf("%s %s %s %s step %d", o.At.UTC().Format("15:04:05.000"), o.Job, o.Client, o.Kind, o.Step)
}

// History collects what every client saw. Add may be called from many
// goroutines at once.
type History struct {
	mu  sync.Mutex
	ops []Op
}

// Add records op.
func (h *History) Add(op Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
}

// Ops returns a copy of the recorded ops, in time order.
func (h *History) Ops() []Op {
	h.mu.Lock()
	out := slices.Clone(h.ops)
	h.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// HistoryName is the name of the history checker's check (and of its
// column in the table).
const HistoryName = "what every client saw keeps the promises (history)"

// CheckHistory verifies the promises of rewind against what the clients
// saw, per job, in time order:
//   - the latest consistent step answered never goes back, except to the
//     step a restore landed on (the job's later steps are gone then), or,
//     in an answer of a newer epoch than any before it, to no older step
//     than the one that epoch resumed from, on which a restore must then
//     land (a coordinator that raised the epoch of a re-gang and died
//     before the re-gang was done: its successor finishes it);
//   - a restore lands on the step the operator named, or else on the
//     newest step restorable at that moment, passing over only steps the
//     coordinator reported unrestorable;
//   - a step once durable on a shared tier stays restorable until
//     retention (keep newer durable steps on that tier), an operator or
//     a restore to an older step removed it;
//   - a rank resumes at the step of the last restore before it.
//
// keep is each tier's retention. Ops are sorted by time first.
func CheckHistory(ops []Op, keep map[string]int) Check {
	c := Check{Name: HistoryName}
	ops = slices.Clone(ops)
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].At.Before(ops[j].At) })
	jobs := map[string][]Op{}
	for _, op := range ops {
		jobs[op.Job] = append(jobs[op.Job], op)
	}
	var problems []string
	var n int
	for _, job := range slices.Sorted(maps.Keys(jobs)) {
		n += len(jobs[job])
		problems = append(problems, checkJobHistory(jobs[job], keep)...)
	}
	if len(problems) > 0 {
		if len(problems) > 5 {
			problems = append(problems[:5], fmt.Sprintf("and %d more", len(problems)-5))
		}
		c.Detail = strings.Join(problems, "; ")
		return c
	}
	c.OK = n > 0
	c.Detail = fmt.Sprintf("%d ops of %d jobs checked", n, len(jobs))
	if n == 0 {
		c.Detail = "no op was recorded"
	}
	return c
}

// jobState is what the checker knows of one job at a point of its history.
type jobState struct {
	hi      int64          // the highest consistent step answered since the last rewind
	hiOp    Op             // the answer that set hi
	durable map[int64]bool // steps seen durable on a shared tier, not yet removed
	tiers   map[int64][]string
	removed map[int64]bool
	last    *Op // the last restore
	epoch   uint64
	// rewinds are the answers that went back across a new epoch, each
	// waiting for a restore to land on the step it went back to.
	rewinds []Op
}

// rewinding reports whether op falls inside the last restore, between
// its plan and its end, and concerns a step after the one it restores.
func (st *jobState) rewinding(op Op, step int64) bool {
	return st.last != nil && !op.At.After(st.last.Done) && step > st.last.Step
}

func checkJobHistory(ops []Op, keep map[string]int) []string {
	st := &jobState{hi: -1, durable: map[int64]bool{}, tiers: map[int64][]string{}, removed: map[int64]bool{}}
	var problems []string
	for _, op := range ops {
		var p string
		switch op.Kind {
		case OpLatest:
			p = st.latest(op)
		case OpRestore:
			p = st.restore(op)
		case OpListing:
			p = st.listing(op, keep)
		case OpRemoved:
			st.forget(op.Step)
			st.removed[op.Step] = true
		case OpResumed:
			if st.last != nil && op.Step != st.last.Step {
				p = fmt.Sprintf("job %s: %s resumed at step %d, the last restore (%s) landed on %d",
					op.Job, op.Client, op.Step, st.last.Client, st.last.Step)
			}
		}
		if p != "" {
			problems = append(problems, p)
		}
	}
	for _, op := range st.rewinds {
		problems = append(problems, fmt.Sprintf("job %s: the latest consistent step went back to %d at %s, across the re-gang of epoch %d, and no restore landed on it",
			op.Job, op.Step, op.At.UTC().Format("15:04:05.000"), op.Epoch))
	}
	return problems
}

func (st *jobState) latest(op Op) string {
	if st.rewinding(op, op.Step) {
		return ""
	}
	newEpoch := st.epoch > 0 && op.Epoch > st.epoch
	st.epoch = max(st.epoch, op.Epoch)
	if op.Step < st.hi && newEpoch && op.Step >= op.EpochStep {
		st.hi, st.hiOp = op.Step, op
		st.rewinds = append(st.rewinds, op)
		return ""
	}
	if op.Step < st.hi {
		return fmt.Sprintf("job %s: the latest consistent step went back: %d at %s, after %d at %s",
			op.Job, op.Step, op.At.UTC().Format("15:04:05.000"), st.hi, st.hiOp.At.UTC().Format("15:04:05.000"))
	}
	if op.Step > st.hi {
		st.hi, st.hiOp = op.Step, op
	}
	return ""
}

// restore judges a restore and rewinds the job to its step: the steps
// after it are the restore's to delete.
func (st *jobState) restore(op Op) string {
	var p string
	switch {
	case slices.Contains(op.Skipped, op.Step):
		p = fmt.Sprintf("job %s: %s landed on step %d, which it reported unrestorable", op.Job, op.Client, op.Step)
	case op.Named >= 0 && op.Step != op.Named:
		p = fmt.Sprintf("job %s: %s named step %d, the restore landed on %d", op.Job, op.Client, op.Named, op.Step)
	case op.Named < 0 && op.Newest > op.Step && !slices.Contains(op.Skipped, op.Newest):
		p = fmt.Sprintf("job %s: %s landed on step %d, though step %d was restorable and not reported unrestorable (skipped %v)",
			op.Job, op.Client, op.Step, op.Newest, op.Skipped)
	}
	st.rewinds = slices.DeleteFunc(st.rewinds, func(r Op) bool { return r.Step >= op.Step })
	for _, s := range op.Skipped {
		st.forget(s)
	}
	for s := range st.durable {
		if s > op.Step {
			st.forget(s)
		}
	}
	st.hi, st.hiOp = op.Step, op
	if op.Done.Before(op.At) {
		op.Done = op.At
	}
	st.last = &op
	return p
}

func (st *jobState) forget(step int64) {
	delete(st.durable, step)
	delete(st.tiers, step)
}

// listing checks that every step seen durable is still restorable, or
// was retired by its tiers' retention, then notes the newly durable.
func (st *jobState) listing(op Op, keep map[string]int) string {
	var lost []string
	for _, s := range slices.Sorted(maps.Keys(st.durable)) {
		if slices.Contains(op.Steps, s) || st.retired(s, op, keep) {
			if !slices.Contains(op.Steps, s) {
				st.forget(s)
			}
			continue
		}
		lost = append(lost, fmt.Sprintf("%d (durable on %s)", s, strings.Join(st.tiers[s], ", ")))
		st.forget(s)
	}
	for tier, steps := range op.Durable {
		for _, s := range steps {
			if st.removed[s] || !slices.Contains(op.Steps, s) || st.rewinding(op, s) {
				continue
			}
			st.durable[s] = true
			if !slices.Contains(st.tiers[s], tier) {
				st.tiers[s] = append(st.tiers[s], tier)
			}
		}
	}
	if len(lost) > 0 {
		return fmt.Sprintf("job %s: lost at %s, neither retired nor removed: steps %s",
			op.Job, op.At.UTC().Format("15:04:05.000"), strings.Join(lost, ", "))
	}
	return ""
}

// retired reports whether retention may have removed step: on each tier
// it was durable on, keep newer steps are durable now.
func (st *jobState) retired(step int64, op Op, keep map[string]int) bool {
	for _, tier := range st.tiers[step] {
		k, ok := keep[tier]
		if !ok {
			return true // no known bound: the checker cannot say
		}
		newer := 0
		for _, s := range op.Durable[tier] {
			if s > step {
				newer++
			}
		}
		if newer < k {
			return false
		}
	}
	return true
}
