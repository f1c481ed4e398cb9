package coordinator

import "fmt"

// Limits bound what callers can make the coordinator hold, and so the work
// any one request can make it do (DESIGN invariant 10). They are checked
// before anything changes: a request over one is refused whole, with an
// error that names the limit's flag, and the index stays as it was. An
// index loaded from the store is not checked: lowering a limit refuses new
// growth, it drops nothing already recorded.
type Limits struct {
	WorldSize      uint32 // ranks of one job
	Jobs           int    // jobs in the index
	StepsPerJob    int    // steps of one job in the index, whatever their state
	CopiesPerShard int    // copies of one rank's shard of one step, in memory and on tiers
}

// limits returns the configuration's limits.
func (c Config) limits() Limits {
	return Limits{WorldSize: c.MaxWorldSize, Jobs: c.MaxJobs, StepsPerJob: c.MaxStepsPerJob, CopiesPerShard: c.MaxCopiesPerShard}
}

// LimitError is a request refused because it would take the coordinator
// over one of its Limits. It wraps ErrInvalid when the request could
// never be accepted at this setting (a world size), ErrRefused when the
// index is full until something is deleted (jobs, steps, copies).
type LimitError struct {
	msg  string
	kind error
}

func (e *LimitError) Error() string { return e.msg }
func (e *LimitError) Unwrap() error { return e.kind }

func overLimit(kind error, format string, args ...any) error {
	return &LimitError{msg: "coordinator: " + fmt.Sprintf(format, args...), kind: kind}
}

// checkRegister checks registering job with worldSize against the limits;
// the caller holds the index. It changes nothing.
func (s *State) checkRegister(job string, worldSize uint32) error {
	if l := s.limits.WorldSize; worldSize > l {
		return overLimit(ErrInvalid, "job %s: world size %d is over the limit of %d (--max-world-size)", job, worldSize, l)
	}
	if _, known := s.Jobs[job]; !known && len(s.Jobs) >= s.limits.Jobs {
		return overLimit(ErrRefused, "job %s: a new job would make %d jobs, over the limit of %d (--max-jobs); delete finished jobs' checkpoints or raise the limit",
			job, len(s.Jobs)+1, s.limits.Jobs)
	}
	return nil
}

// checkCommit checks recording a committed copy against the limits; the
// caller holds the index. It changes nothing. A step about to be
// superseded (a new world size) counts as its replacement will.
func (s *State) checkCommit(j *Job, rec Record) error {
	st := j.Steps[rec.Step]
	if st == nil || st.WorldSize != j.WorldSize && rec.WorldSize == j.WorldSize && st.State != Consistent {
		if st == nil && len(j.Steps) >= s.limits.StepsPerJob {
			return overLimit(ErrRefused, "job %s: step %d would be its %d-th step in the index, over the limit of %d (--max-steps-per-job); delete old steps (rewind delete) or raise the limit",
				j.ID, rec.Step, len(j.Steps)+1, s.limits.StepsPerJob)
		}
		return nil
	}
	n := 0
	tier := rec.tier()
	for _, c := range st.Copies[rec.Rank] {
		if c.Node == rec.Node && c.Tier == tier {
			return nil // replaces that copy
		}
		n++
	}
	if n >= s.limits.CopiesPerShard {
		return overLimit(ErrRefused, "job %s step %d rank %d: a copy on %s:%s would make %d copies of the shard, over the limit of %d (--max-copies-per-shard)",
			j.ID, rec.Step, rec.Rank, tier, rec.Node, n+1, s.limits.CopiesPerShard)
	}
	return nil
}
