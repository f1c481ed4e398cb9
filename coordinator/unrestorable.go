package coordinator

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// What the index knows to be bad, besides what agents commit:
//
//   - A copy found corrupt (a checksum mismatch on a restore's fetch, on
//     rewind verify, or on an agent's own check of its memory) moves from
//     Step.Copies to Step.Bad: it is shown, as corrupt, and never planned
//     from. It leaves Bad when it is deleted (retention, a slot reused) or
//     committed again (a verify that finds it whole).
//   - A step some rank could not be restored from, every copy of that
//     rank failing, is marked (Step.Unrestorable) with each failed copy
//     and why: it is never the job's latest consistent step, and a
//     restore or recovery that chooses its step passes over it for the
//     next older one. A new copy of a rank that failed clears the mark, as
//     does a verify that finds every rank whole; a restore that names the
//     step tries it again.

// Unrestorable is why a restore could not bring a step back whole. Once
// recorded it is never changed (a new finding replaces it): reads share it
// outside the lock.
type Unrestorable struct {
	At    time.Time     `json:"at"`
	Ranks []RankFailure `json:"ranks"`
}

// RankFailure is a rank none of whose copies of a step served.
type RankFailure struct {
	Rank   uint32        `json:"rank"`
	Copies []CopyFailure `json:"copies"`
}

// CopyFailure is one copy a restore tried and why it did not serve. An
// empty Copy is a rank with no copy left at all, Error saying so.
type CopyFailure struct {
	Copy    string `json:"copy"` // "tier:node"
	Error   string `json:"error"`
	Corrupt bool   `json:"corrupt,omitempty"`
	// Unreachable: its store did not serve it (down, a network error, a
	// server error); the copy may be whole.
	Unreachable bool `json:"unreachable,omitempty"`
}

// names reports whether u lists rank; false on a nil u.
func (u *Unrestorable) names(rank uint32) bool {
	if u == nil {
		return false
	}
	for _, r := range u.Ranks {
		if r.Rank == rank {
			return true
		}
	}
	return false
}

// maxFailureText bounds each copy's reason as a step's mark keeps it.
const maxFailureText = 512

// String says which ranks failed and how: "rank 0: nvme:node-0 corrupt
// (…); pfs:- corrupt (…)".
func (u *Unrestorable) String() string {
	var parts []string
	for _, r := range u.Ranks {
		var cs []string
		for _, c := range r.Copies {
			if c.Copy == "" {
				cs = append(cs, c.Error)
				continue
			}
			what := "failed"
			switch {
			case c.Corrupt:
				what = "corrupt"
			case c.Unreachable:
				what = "unreachable"
			}
			cs = append(cs, fmt.Sprintf("%s %s (%s)", c.Copy, what, c.Error))
		}
		if len(cs) == 0 {
			cs = append(cs, "no copy")
		}
		parts = append(parts, fmt.Sprintf("rank %d: %s", r.Rank, strings.Join(cs, "; ")))
	}
	return strings.Join(parts, "; ")
}

func (u *Unrestorable) proto(step int64) *coordpb.UnrestorableStep {
	p := &coordpb.UnrestorableStep{Step: step, AtUnixNano: u.At.UnixNano()}
	for _, r := range u.Ranks {
		rf := &coordpb.RankFailure{Rank: r.Rank}
		for _, c := range r.Copies {
			rf.Copies = append(rf.Copies, &coordpb.CopyFailure{Copy: c.Copy, Error: c.Error, Corrupt: c.Corrupt, Unreachable: c.Unreachable})
		}
		p.Ranks = append(p.Ranks, rf)
	}
	return p
}

// skippedText says, on one line, which steps a restore passed over and why.
func skippedText(skipped []*coordpb.UnrestorableStep) string {
	var parts []string
	for _, s := range skipped {
		u := Unrestorable{}
		for _, r := range s.Ranks {
			rf := RankFailure{Rank: r.Rank}
			for _, c := range r.Copies {
				rf.Copies = append(rf.Copies, CopyFailure{Copy: c.Copy, Error: c.Error, Corrupt: c.Corrupt, Unreachable: c.Unreachable})
			}
			u.Ranks = append(u.Ranks, rf)
		}
		parts = append(parts, fmt.Sprintf("step %d (%s)", s.Step, u.String()))
	}
	return strings.Join(parts, "; ")
}

// addBad records c, found corrupt, among the step's bad copies, replacing
// one at the same place, and returns the bad copy.
func (s *Step) addBad(c *Copy) *Copy {
	if s.Bad == nil {
		s.Bad = map[uint32][]*Copy{}
	}
	bad := *c
	bad.State = CopyCorrupt
	others := slices.DeleteFunc(s.Bad[c.Rank], func(b *Copy) bool { return b.Node == c.Node && b.Tier == c.Tier })
	s.Bad[c.Rank] = append(others, &bad)
	return &bad
}

// dropBad removes rank's bad copies that match, and reports whether any
// did.
func (s *Step) dropBad(rank uint32, match func(*Copy) bool) bool {
	cs := s.Bad[rank]
	if len(cs) == 0 {
		return false
	}
	kept := slices.DeleteFunc(slices.Clone(cs), match)
	if len(kept) == len(cs) {
		return false
	}
	if len(kept) == 0 {
		delete(s.Bad, rank)
	} else {
		s.Bad[rank] = kept
	}
	return true
}

// MarkUnrestorable records that a restore could not bring job's step back
// whole, and why (nil u clears the mark). The step leaves the job's latest
// consistent step and its protected step.
func (s *State) MarkUnrestorable(job string, step int64, u *Unrestorable, ch *Changes) error {
	j := s.Jobs[job]
	if j == nil {
		return fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
	}
	st := j.Steps[step]
	if st == nil {
		return fmt.Errorf("%w: coordinator: job %s has no step %d", ErrNotFound, job, step)
	}
	if u != nil {
		for i := range u.Ranks {
			for k := range u.Ranks[i].Copies {
				if e := u.Ranks[i].Copies[k].Error; len(e) > maxFailureText {
					u.Ranks[i].Copies[k].Error = e[:maxFailureText] + "…"
				}
			}
		}
	}
	st.Unrestorable = u
	ch.Steps = append(ch.Steps, st)
	ch.Sync = true
	s.updateLatest(j, ch, "found unrestorable")
	return nil
}
