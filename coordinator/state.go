package coordinator

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"rewind.dev/rewind/shm"
)

// StepState is where a step stands:
//
//	partial ──every rank committed──▶ consistent
//	   │                                  │ every copy gone
//	   │ a rank committed a later step    ▼
//	   └──without this one──▶ abandoned  (dropped from the index)
//
// An abandoned step becomes consistent if its missing commits arrive after
// all (reports from different nodes are not ordered).
type StepState string

// The step states.
const (
	Partial    StepState = "partial"
	Consistent StepState = "consistent"
	Abandoned  StepState = "abandoned"
)

// CopyState is where a copy of a rank's shard stands, as agents report
// it (the labels of coordpb.CopyState): a committed copy is a restore
// source; a corrupt one is kept apart (Step.Bad) until it is deleted or
// found whole again; a report of a deleted one removes it.
type CopyState string

// The copy states.
const (
	CopyCommitted CopyState = "committed"
	CopyCorrupt   CopyState = "corrupt"
	CopyDeleted   CopyState = "deleted"
)

// Errors, wrapped with details; the server maps them to gRPC codes.
var (
	ErrUnknownJob = errors.New("unknown job")
	ErrInvalid    = errors.New("invalid argument")
	ErrNotFound   = errors.New("not found")
	ErrRefused    = errors.New("refused")
)

// Copy is one copy of one rank's shard of a step. Once in the index a
// Copy is never changed (a change records a new one): reads share them
// outside the lock (view.go).
type Copy struct {
	Rank  uint32    `json:"rank"`
	Node  string    `json:"node"`
	Tier  string    `json:"tier"`
	Size  uint64    `json:"size"`
	Sum   string    `json:"sum"`
	State CopyState `json:"state"`
}

// Step is a step of a job and its copies.
type Step struct {
	Job          string
	Step         int64
	WorldSize    uint32
	State        StepState
	ConsistentAt time.Time
	Copies       map[uint32][]*Copy // by rank; a rank without copies has no entry
	// Bad holds the copies found corrupt (unrestorable.go), by rank: shown,
	// never planned from, gone when deleted or re-committed.
	Bad map[uint32][]*Copy
	// Unrestorable is set when a restore could not bring the step back
	// whole (unrestorable.go): an automatic choice of step skips it, and
	// it is never the job's latest consistent step.
	Unrestorable *Unrestorable
	// Epoch is the epoch whose ranks saved the step (epoch.go); 0 when
	// no rank's save named one.
	Epoch uint64
	// safe counts the ranks whose copies in memory outlive the loss of
	// any one node (see survives); derived from Copies, kept as they
	// change.
	safe uint32
}

// survives reports whether a rank's copies in memory outlive the loss of
// any one node: they are on two nodes or more. Tier copies do not count:
// a step on a shared tier is restorable whatever memory holds, and one on
// a node's NVMe goes with the node's memory.
func survives(cs []*Copy) bool {
	first := ""
	for _, c := range cs {
		switch {
		case c.Tier != "shm":
		case first == "":
			first = c.Node
		case c.Node != first:
			return true
		}
	}
	return false
}

// noteSafe adjusts s.safe for a rank whose copies went from surviving a
// node's loss (was) to now.
func (s *Step) noteSafe(was, now bool) {
	switch {
	case now && !was:
		s.safe++
	case was && !now:
		s.safe--
	}
}

// protectable reports whether the step can be restored from memory after
// the loss of any one node: consistent, and every rank's copies in memory
// survive it.
func (s *Step) protectable() bool {
	return s.usable() && s.safe == s.WorldSize
}

// complete reports whether every rank has at least one copy (not one
// found corrupt).
func (s *Step) complete() bool { return uint32(len(s.Copies)) == s.WorldSize }

// usable reports whether the step can be the job's latest consistent
// step: consistent, every rank with a good copy, and not found
// unrestorable.
func (s *Step) usable() bool {
	return s.State == Consistent && s.complete() && s.Unrestorable == nil
}

// Job is a job known to the coordinator.
type Job struct {
	ID        string
	WorldSize uint32
	Placement map[uint32]string // rank -> node
	Latest    int64             // latest usable step (Step.usable); -1 if none
	// Protected is the newest consistent step that memory keeps through
	// the loss of any one node (every rank's shard in the memory of two
	// nodes); -1 if none. Agents keep it beside Latest, so that a node
	// lost while Latest's replicas are being made leaves it to restore.
	// Derived from the steps, not stored.
	Protected int64
	Steps     map[int64]*Step
	// Epoch is the job's gang generation (epoch.go), raised at each
	// re-gang; 0 reads as 1. Epochs holds the last ones and the step
	// each resumed from, oldest first.
	Epoch  uint64
	Epochs []EpochStart
	// rankLatest is the newest step each rank of the current world size
	// has committed.
	rankLatest map[uint32]int64
	// answered is 1 + the newest latest step this process told anyone
	// (Latest, ListJobs, agents' pins and consistent steps); 0: none.
	// Not stored.
	answered int64
}

// answer notes that step was told as the job's latest, and returns it.
func (j *Job) answer(step int64) int64 {
	j.answered = max(j.answered, step+1)
	return step
}

// State is the coordinator's index in memory. It is not safe for concurrent
// use: the Coordinator serializes access.
type State struct {
	Jobs  map[string]*Job
	Nodes map[string]*NodeInfo
	now   func() time.Time
	// nodeJobs is the set of jobs placed on or holding copies on each
	// node: the jobs whose pins the node's agent needs.
	nodeJobs map[string]map[string]bool
	// noted is the node and job noteNode saw last: a report's records
	// are one node's, mostly of one job. nodeJobs only grows.
	noted [2]string
	// limits bound what registrations and reports may add (limits.go).
	limits Limits
}

func (s *State) noteNode(node, job string) {
	if s.noted == [2]string{node, job} {
		return
	}
	s.noted = [2]string{node, job}
	m := s.nodeJobs[node]
	if m == nil {
		m = map[string]bool{}
		s.nodeJobs[node] = m
	}
	m[job] = true
}

// JobsOn returns the jobs placed on or holding copies on node.
func (s *State) JobsOn(node string) map[string]bool { return s.nodeJobs[node] }

// NodeInfo is a registered agent.
type NodeInfo struct {
	Name          string    `json:"name"`
	Addr          string    `json:"addr"`
	FailureDomain string    `json:"failure_domain"`
	BudgetBytes   uint64    `json:"budget"`
	RegisteredAt  time.Time `json:"registered_at"`
}

// NewState returns an empty index, with DefaultConfig's limits.
func NewState(now func() time.Time) *State {
	return &State{Jobs: map[string]*Job{}, Nodes: map[string]*NodeInfo{}, now: now, nodeJobs: map[string]map[string]bool{},
		limits: DefaultConfig().limits()}
}

// newState returns an empty index with the configuration's clock and
// limits.
func (c Config) newState() *State {
	s := NewState(c.Clock.Now)
	s.limits = c.limits()
	return s
}

// Changes lists what an operation modified, for the store to persist.
// Sync is set when the change decides a state (a job registered, a step
// consistent): the store must sync it before the caller is answered.
type Changes struct {
	Jobs       []*Job
	Steps      []*Step
	Copies     []CopyKey // written (or deleted when the copy is absent)
	Dropped    []StepKey
	Sync       bool
	Consistent []StepKey // steps that became consistent
	Back       []WentBack
}

// WentBack is a job's latest consistent step going back: a copy of it
// was lost, or the step was found unrestorable or superseded. The
// coordinator logs each, as a warning when it goes below an answer.
type WentBack struct {
	Job      string
	From, To int64
	Answered int64 // the newest latest step told before (-1: none)
	Why      string
}

// StepKey names a step.
type StepKey struct {
	Job  string
	Step int64
}

// CopyKey names a copy.
type CopyKey struct {
	Job  string
	Step int64
	Rank uint32
	Node string
	Tier string
	Copy *Copy // nil: deleted
}

// RegisterJob declares job with worldSize and merges placement. A different
// world size re-registers the job: later commits must carry the new one.
func (s *State) RegisterJob(job string, worldSize uint32, placement map[uint32]string, ch *Changes) (reregistered bool, err error) {
	if err := shm.ValidateJob(job); err != nil {
		return false, fmt.Errorf("%w: coordinator: %v", ErrInvalid, err)
	}
	if worldSize == 0 {
		return false, fmt.Errorf("%w: coordinator: job %s: world size 0", ErrInvalid, job)
	}
	for r := range placement {
		if r >= worldSize {
			return false, fmt.Errorf("%w: coordinator: job %s: rank %d placed but world size is %d", ErrInvalid, job, r, worldSize)
		}
	}
	if err := s.checkRegister(job, worldSize); err != nil {
		return false, err
	}
	j := s.Jobs[job]
	switch {
	case j == nil:
		j = &Job{ID: job, WorldSize: worldSize, Placement: map[uint32]string{}, Latest: -1, Protected: -1, Steps: map[int64]*Step{}, rankLatest: map[uint32]int64{}}
		s.Jobs[job] = j
		ch.Sync = true
	case j.WorldSize != worldSize:
		j.WorldSize, j.Placement, j.rankLatest = worldSize, map[uint32]string{}, map[uint32]int64{}
		reregistered, ch.Sync = true, true
	}
	changed := false
	for r, n := range placement {
		s.noteNode(n, job)
		if j.Placement[r] != n {
			j.Placement[r], changed = n, true
		}
	}
	if changed || ch.Sync {
		ch.Jobs = append(ch.Jobs, j)
	}
	return reregistered, nil
}

// Apply records one shard event reported by an agent.
func (s *State) Apply(rec Record, ch *Changes) error {
	j := s.Jobs[rec.Job]
	if j == nil {
		return fmt.Errorf("%w: coordinator: report for job %q, which is not registered", ErrUnknownJob, rec.Job)
	}
	if rec.Step < 0 {
		return fmt.Errorf("%w: coordinator: job %s: negative step %d", ErrInvalid, rec.Job, rec.Step)
	}
	if rec.State == CopyCommitted {
		if st := j.Steps[rec.Step]; st != nil && j.leftBehind(st, rec) {
			s.supersede(j, st, ch)
		}
		if err := j.checkEpoch(rec); err != nil {
			return err
		}
		if err := s.checkCommit(j, rec); err != nil {
			return err
		}
	}
	want, what := j.WorldSize, "job"
	if st := j.Steps[rec.Step]; st != nil {
		want, what = st.WorldSize, "step"
		if st.WorldSize != j.WorldSize && rec.WorldSize == j.WorldSize && rec.State == CopyCommitted {
			if st.State == Consistent {
				return fmt.Errorf("%w: coordinator: job %s step %d is a consistent checkpoint at world size %d; the job now runs with %d and cannot save that step number again until it is deleted (rewind delete %s %d --force)",
					ErrRefused, rec.Job, rec.Step, st.WorldSize, j.WorldSize, rec.Job, rec.Step)
			}
			s.supersede(j, st, ch)
			want = j.WorldSize
		}
	}
	if rec.WorldSize != want {
		return fmt.Errorf("%w: coordinator: job %s step %d: report for world size %d, the %s has %d",
			ErrInvalid, rec.Job, rec.Step, rec.WorldSize, what, want)
	}
	if rec.Rank >= rec.WorldSize {
		return fmt.Errorf("%w: coordinator: job %s step %d: rank %d out of range for world size %d", ErrInvalid, rec.Job, rec.Step, rec.Rank, rec.WorldSize)
	}
	switch rec.State {
	case CopyCommitted:
		if rec.Sum == "" || strings.ContainsAny(rec.Sum, " \t\n") || strings.ContainsAny(rec.Node, " \t\n/") || rec.Node == "" {
			return fmt.Errorf("%w: coordinator: job %s step %d rank %d: commit without a node or header checksum (node %q, checksum %q)",
				ErrInvalid, rec.Job, rec.Step, rec.Rank, rec.Node, rec.Sum)
		}
		s.commit(j, rec, ch)
	case CopyDeleted, CopyCorrupt:
		s.remove(j, rec, ch)
	default:
		return fmt.Errorf("%w: coordinator: unknown shard state %q", ErrInvalid, rec.State)
	}
	return nil
}

func (s *State) commit(j *Job, rec Record, ch *Changes) {
	st := j.Steps[rec.Step]
	if st == nil {
		st = &Step{Job: j.ID, Step: rec.Step, WorldSize: rec.WorldSize, State: Partial, Copies: map[uint32][]*Copy{}}
		j.Steps[rec.Step] = st
		ch.Steps = append(ch.Steps, st)
		ch.Dropped = slices.DeleteFunc(ch.Dropped, func(k StepKey) bool { return k == StepKey{j.ID, rec.Step} })
		// A late step: some rank may have moved past it already.
		for r, latest := range j.rankLatest {
			if latest > st.Step && r != rec.Rank && st.WorldSize == j.WorldSize {
				st.State = Abandoned
				break
			}
		}
	}
	j.noteEpoch(st, rec, ch)
	tier := rec.tier()
	s.noteNode(rec.Node, j.ID)
	cs := st.Copies[rec.Rank] // looked up once: the map holds a rank per entry
	for _, c := range cs {
		if c.Node == rec.Node && c.Tier == tier && c.Sum == rec.Sum {
			return // a duplicate report
		}
	}
	was := survives(cs)
	c := &Copy{Rank: rec.Rank, Node: rec.Node, Tier: tier, Size: rec.Size, Sum: rec.Sum, State: CopyCommitted}
	cs = append(slices.DeleteFunc(cs, func(c *Copy) bool { return c.Node == rec.Node && c.Tier == tier }), c)
	st.Copies[rec.Rank] = cs
	st.noteSafe(was, survives(cs))
	ch.Copies = append(ch.Copies, CopyKey{Job: j.ID, Step: rec.Step, Rank: rec.Rank, Node: rec.Node, Tier: tier, Copy: c})
	// A copy found corrupt here before is replaced (its key now holds the
	// good one), and a new copy of a rank that made the step unrestorable
	// is worth trying again.
	st.dropBad(rec.Rank, func(b *Copy) bool { return b.Node == rec.Node && b.Tier == tier })
	if st.Unrestorable.names(rec.Rank) {
		st.Unrestorable = nil
		ch.Steps = append(ch.Steps, st)
		ch.Sync = true
	}
	if st.State != Consistent && st.complete() {
		st.State, st.ConsistentAt = Consistent, s.now()
		ch.Steps = append(ch.Steps, st)
		ch.Consistent = append(ch.Consistent, StepKey{j.ID, st.Step})
		ch.Sync = true
	}
	if rec.WorldSize == j.WorldSize {
		if l, ok := j.rankLatest[rec.Rank]; !ok || rec.Step > l {
			j.rankLatest[rec.Rank] = rec.Step
			s.abandon(j, rec.Rank, rec.Step, ch)
		}
	}
	if st.usable() && st.Step > j.Latest {
		j.Latest = st.Step
		ch.Jobs = append(ch.Jobs, j)
		ch.Sync = true
	}
	if st.Step > j.Protected && st.protectable() {
		j.Protected = st.Step
	}
}

// abandon marks the partial steps before step that rank moved past without
// committing: they can never become consistent.
func (s *State) abandon(j *Job, rank uint32, step int64, ch *Changes) {
	for _, st := range j.Steps {
		if st.State == Partial && st.Step < step && st.WorldSize == j.WorldSize && len(st.Copies[rank]) == 0 {
			st.State = Abandoned
			ch.Steps = append(ch.Steps, st)
		}
	}
}

// supersede drops a step left unfinished at the job's old world size when
// the job, re-registered with a new one (an elastic restart), saves the
// same step number: the new gang's step replaces it, and its old copies
// leave the index (agents still holding them are refused if they report
// them again, as for any report of the old size on the new step).
func (s *State) supersede(j *Job, st *Step, ch *Changes) {
	for _, m := range []map[uint32][]*Copy{st.Copies, st.Bad} {
		for rank, cs := range m {
			for _, c := range cs {
				ch.Copies = append(ch.Copies, CopyKey{Job: j.ID, Step: st.Step, Rank: rank, Node: c.Node, Tier: c.Tier})
			}
		}
	}
	delete(j.Steps, st.Step)
	ch.Steps = slices.DeleteFunc(ch.Steps, func(x *Step) bool { return x == st })
	ch.Dropped = append(ch.Dropped, StepKey{j.ID, st.Step})
	s.updateLatest(j, ch, "superseded by the job's new world size")
}

func (s *State) remove(j *Job, rec Record, ch *Changes) {
	st := j.Steps[rec.Step]
	if st == nil {
		return
	}
	tier := rec.tier()
	// A deletion that names a checksum removes only that copy: a rank
	// that saved the same step twice (a retried save) has its newer copy
	// recorded, and giving up the slot of the older one leaves it. A
	// corrupt copy is found so whatever its checksum, and kept apart.
	match := func(c *Copy) bool {
		return c.Node == rec.Node && c.Tier == tier && (rec.State != CopyDeleted || rec.Sum == "" || c.Sum == rec.Sum)
	}
	key := CopyKey{Job: j.ID, Step: rec.Step, Rank: rec.Rank, Node: rec.Node, Tier: tier}
	if rec.State == CopyDeleted && st.dropBad(rec.Rank, match) {
		ch.Copies = append(ch.Copies, key)
	}
	cs := st.Copies[rec.Rank] // never an entry for a rank without copies
	was := survives(cs)
	var gone []*Copy
	cs = slices.DeleteFunc(cs, func(c *Copy) bool {
		if match(c) {
			gone = append(gone, c)
		}
		return match(c)
	})
	if len(gone) > 0 {
		st.noteSafe(was, survives(cs))
		if len(cs) == 0 {
			delete(st.Copies, rec.Rank)
		} else {
			st.Copies[rec.Rank] = cs
		}
		if rec.State == CopyCorrupt {
			key.Copy = st.addBad(gone[len(gone)-1])
		}
		ch.Copies = append(ch.Copies, key)
	}
	if len(st.Copies) == 0 && len(st.Bad) == 0 {
		delete(j.Steps, rec.Step)
		ch.Steps = slices.DeleteFunc(ch.Steps, func(x *Step) bool { return x == st })
		ch.Dropped = append(ch.Dropped, StepKey{j.ID, rec.Step})
	}
	if len(gone) == 0 {
		return
	}
	// Latest is the newest usable step: losing a copy of any other step
	// cannot change it (a newer step is not usable, an older one is not
	// the newest), so only a copy of the latest step costs a scan of the
	// job's steps.
	if rec.Step == j.Latest {
		s.updateLatest(j, ch, fmt.Sprintf("rank %d's copy on %s (%s) %s", rec.Rank, rec.Node, tier, rec.State))
	} else if rec.Step == j.Protected {
		j.updateProtected()
	}
}

// updateLatest recomputes the newest usable step (Step.usable); why says
// what changed, should the step go back.
func (s *State) updateLatest(j *Job, ch *Changes, why string) {
	latest := int64(-1)
	for _, st := range j.Steps {
		if st.usable() && st.Step > latest {
			latest = st.Step
		}
	}
	if latest < j.Latest {
		ch.Back = append(ch.Back, WentBack{Job: j.ID, From: j.Latest, To: latest, Answered: j.answered - 1, Why: why})
	}
	if latest != j.Latest {
		j.Latest = latest
		ch.Jobs = append(ch.Jobs, j)
		ch.Sync = true
	}
	j.updateProtected()
}

// updateProtected recomputes j.Protected from the job's steps.
func (j *Job) updateProtected() {
	j.Protected = -1
	for _, st := range j.Steps {
		if st.Step > j.Protected && st.protectable() {
			j.Protected = st.Step
		}
	}
}

// Record is one shard event from an agent.
type Record struct {
	Job       string
	Step      int64
	Rank      uint32
	WorldSize uint32
	Node      string
	Tier      string // "" means "shm"
	Size      uint64
	Sum       string
	State     CopyState
	Epoch     uint64 // the saving rank's epoch; 0 for a copy the coordinator ordered (epoch.go)
}

func (r Record) tier() string {
	if r.Tier == "" {
		return "shm"
	}
	return r.Tier
}

// SortedSteps returns a job's steps, oldest first.
func (j *Job) SortedSteps() []*Step {
	out := make([]*Step, 0, len(j.Steps))
	for _, st := range j.Steps {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b *Step) int { return int(a.Step - b.Step) })
	return out
}

// Reconcile makes an agent's inventory the truth about the copies in its
// node's shared memory: a copy the index holds on node that the inventory
// lacks (deleted or found corrupt while the coordinator was not told), or
// one it holds as corrupt, is removed.
func (s *State) Reconcile(node string, inventory []Record, ch *Changes) {
	type key struct {
		job  string
		step int64
		rank uint32
	}
	have := make(map[key]bool, len(inventory))
	for _, r := range inventory {
		have[key{r.Job, r.Step, r.Rank}] = true
	}
	var gone []Record
	for _, j := range s.Jobs {
		for _, st := range j.Steps {
			// A copy found corrupt is not in the inventory (which lists
			// committed shards): the agent's own listing shows it.
			for _, m := range []map[uint32][]*Copy{st.Copies, st.Bad} {
				for rank, cs := range m {
					for _, c := range cs {
						if c.Node == node && c.Tier == "shm" && !have[key{j.ID, st.Step, rank}] {
							gone = append(gone, Record{Job: j.ID, Step: st.Step, Rank: rank, WorldSize: st.WorldSize, Node: node, State: CopyDeleted})
						}
					}
				}
			}
		}
	}
	for _, r := range gone {
		s.remove(s.Jobs[r.Job], r, ch)
	}
}
