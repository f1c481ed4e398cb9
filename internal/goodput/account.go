package goodput

import (
	"slices"
	"time"

	"rewind.dev/rewind/internal/demo"
)

// Record is what one configuration's run saw: every rank process with
// its report, every fault, every recovery the coordinator announced.
type Record struct {
	Mode       string
	Start, End time.Time // the first gang's start; the run's stop
	StepTime   time.Duration
	Procs      []*RankProc
	Faults     []*Fault
	Recoveries []*Recovery
	// Failed are the recoveries the coordinator gave up on, each its
	// time from the start and its error: the job stopped there.
	Failed []string
}

// RankProc is one process of a rank.
type RankProc struct {
	Rank    uint32
	Node    string
	Started time.Time
	Events  []demo.Event // stamped when read
}

// Recovery is a re-gang the coordinator announced, with its phases.
type Recovery struct {
	Step                        int64  // the step every rank resumes from
	Node                        string // the node declared dead
	Fault                       int    // the fault that caused it: the latest on Node before its detection (-1: none)
	Detected, Planned, Restored time.Time
	Reason                      string
}

// Term is a share of wall time.
type Term int

// The terms every second of a rank's wall time is accounted into.
const (
	TermCompute    Term = iota // compute of a step that counted (the job kept it)
	TermCheckpoint             // the step's blocking save
	TermSync                   // the rest of a kept step: waiting for the other ranks, reporting
	TermLost                   // work thrown away: steps past the checkpoint resumed from, a step cut off
	TermDetection              // from a fault to its detection
	TermRestore                // the coordinator's restore, and the ranks reading their state
	TermRestart                // from the restore to the new processes reading their state
	numTerms
)

var termNames = [numTerms]string{"useful compute", "in-step checkpoint", "step sync (waiting for other ranks)",
	"work lost and redone", "detection", "restore", "restart"}

func (t Term) String() string { return termNames[t] }

// Breakdown is a configuration's accounting, each figure the mean over
// its ranks.
type Breakdown struct {
	Wall       time.Duration
	Terms      [numTerms]time.Duration
	Steps      float64 // kept steps
	Recoveries int
	// Faulted is how many recoveries a fault caused (the others declared
	// a live node dead).
	Faulted int
}

// Goodput is useful compute over wall time.
func (b Breakdown) Goodput() float64 {
	if b.Wall <= 0 {
		return 0
	}
	return float64(b.Terms[TermCompute]) / float64(b.Wall)
}

// Account splits every rank's wall time, from the run's start to its last
// step (the run's end when its last process reported none), into terms,
// and returns their means over ranks.
func Account(rec *Record) Breakdown {
	ranks := map[uint32]bool{}
	for _, p := range rec.Procs {
		ranks[p.Rank] = true
	}
	b := Breakdown{Recoveries: len(rec.Recoveries)}
	for _, r := range rec.Recoveries {
		if r.Fault >= 0 {
			b.Faulted++
		}
	}
	if len(ranks) == 0 {
		return b
	}
	for r := range ranks {
		terms, wall, kept := accountRank(rec, r)
		b.Wall += wall
		for t := range terms {
			b.Terms[t] += terms[t]
		}
		b.Steps += float64(kept)
	}
	n := time.Duration(len(ranks))
	b.Wall /= n
	for t := range b.Terms {
		b.Terms[t] /= n
	}
	b.Steps /= float64(len(ranks))
	return b
}

// span is a stretch of a rank's time given to a term.
type span struct {
	from, to time.Time
	term     Term
}

func (s span) len() time.Duration { return max(0, s.to.Sub(s.from)) }

// accountRank accounts one rank. Its processes follow one another, so
// their reports cover its time once: each step from the previous event to
// its own (laid out backwards from it: the save, before it the compute,
// the rest sync), lost when a later restart resumed from an earlier step;
// a process's time after its last report is lost (a step cut off). The
// recoveries' windows (fault to detection, to restored, to the rank's new
// process) replace whatever the reports say of that time, except the
// steps the job kept: training that went on while a fault was being
// detected (a node cut off from gossip still commits) is useful.
func accountRank(rec *Record, rank uint32) (terms [numTerms]time.Duration, wall time.Duration, kept int) {
	var procs []*RankProc
	for _, p := range rec.Procs {
		if p.Rank == rank {
			procs = append(procs, p)
		}
	}
	slices.SortFunc(procs, func(a, b *RankProc) int { return a.Started.Compare(b.Started) })
	end := rec.End
	if last := procs[len(procs)-1]; lastStep(last) != nil {
		end = lastStep(last).At
	}
	clip := func(t time.Time) time.Time {
		if t.Before(rec.Start) {
			return rec.Start
		}
		if t.After(end) {
			return end
		}
		return t
	}
	windows := recoveryWindows(rec, procs, clip)
	var keptSpans, otherSpans []span
	add := func(s span) {
		s.from, s.to = clip(s.from), clip(s.to)
		if s.term == TermCompute || s.term == TermCheckpoint || s.term == TermSync {
			keptSpans = append(keptSpans, s)
		} else {
			otherSpans = append(otherSpans, s)
		}
	}
	add(span{rec.Start, procs[0].Started, TermRestart})
	for i, p := range procs {
		limit := keepLimit(procs[i+1:])
		next := end
		if i+1 < len(procs) {
			next = procs[i+1].Started
		}
		prev := p.Started
		for _, e := range p.Events {
			if e.At.After(end) {
				break
			}
			// Lines are stamped as read: keep them in the process's time.
			e.At = minTime(maxTime(e.At, prev), next)
			switch e.Kind {
			case demo.KindFresh, demo.KindResumed:
				layout(prev, e.At, add, TermRestart, piece{e.Restore, TermRestore})
			case demo.KindSaved:
				if e.Step > limit {
					add(span{prev, e.At, TermLost})
					break
				}
				kept++
				layout(prev, e.At, add, TermSync, piece{e.Compute, TermCompute}, piece{e.Save, TermCheckpoint})
			case demo.KindSaveFailed:
				if e.Step > limit {
					add(span{prev, e.At, TermLost})
					break
				}
				kept++ // computed, its save failed: training went on
				c := min(rec.StepTime, e.At.Sub(prev))
				add(span{prev, prev.Add(c), TermCompute})
				add(span{prev.Add(c), e.At, TermCheckpoint})
			default:
				continue
			}
			prev = e.At
		}
		add(span{prev, next, TermLost})
	}
	// Every instant lies in one span of the reports. A kept step's time
	// stays its own (training went on while the fault was detected); the
	// recovery's windows take the rest of theirs.
	for _, s := range keptSpans {
		terms[s.term] += s.len()
	}
	for _, s := range otherSpans {
		terms[s.term] += s.len() - overlapAll(s, windows)
	}
	for _, w := range windows {
		terms[w.term] += w.len() - overlapAll(w, keptSpans)
	}
	return terms, end.Sub(rec.Start), kept
}

// overlapAll is a span's overlap with disjoint spans.
func overlapAll(s span, with []span) time.Duration {
	var d time.Duration
	for _, w := range with {
		d += overlap(s, w)
	}
	return d
}

// piece is a duration of a term inside an event's interval.
type piece struct {
	d    time.Duration
	term Term
}

// layout gives [from, to] to pieces laid backwards from to (the last
// piece ends at to), each cut at from, and the rest at the start to rest.
func layout(from, to time.Time, add func(span), rest Term, pieces ...piece) {
	at := to
	for i := len(pieces) - 1; i >= 0; i-- {
		start := at.Add(-pieces[i].d)
		if start.Before(from) {
			start = from
		}
		add(span{start, at, pieces[i].term})
		at = start
	}
	add(span{from, at, rest})
}

// keepLimit is the newest step of a process that the job kept: the
// lowest step any later process of the rank resumed from.
func keepLimit(later []*RankProc) int64 {
	limit := int64(1<<63 - 1)
	for _, p := range later {
		for _, e := range p.Events {
			if e.Kind == demo.KindFresh || e.Kind == demo.KindResumed {
				limit = min(limit, e.Step)
				break
			}
		}
	}
	return limit
}

func lastStep(p *RankProc) *demo.Event {
	for i := len(p.Events) - 1; i >= 0; i-- {
		if k := p.Events[i].Kind; k == demo.KindSaved || k == demo.KindSaveFailed {
			return &p.Events[i]
		}
	}
	return nil
}

// recoveryWindows returns each recovery's detection, restore and restart
// windows for a rank, clipped and made disjoint (a window starts no
// earlier than the one before it ended). A recovery no fault caused
// has no detection window.
func recoveryWindows(rec *Record, procs []*RankProc, clip func(time.Time) time.Time) []span {
	var out []span
	var floor time.Time
	for _, r := range rec.Recoveries {
		fault := r.Detected
		if r.Fault >= 0 && r.Fault < len(rec.Faults) {
			fault = rec.Faults[r.Fault].At
		}
		next := rec.End
		for _, p := range procs {
			if !p.Started.Before(r.Restored) {
				next = p.Started
				break
			}
		}
		at := []time.Time{fault, r.Detected, r.Restored, next}
		for i := range at {
			at[i] = clip(at[i])
			if at[i].Before(floor) {
				at[i] = floor
			}
			if i > 0 && at[i].Before(at[i-1]) {
				at[i] = at[i-1]
			}
		}
		out = append(out, span{at[0], at[1], TermDetection}, span{at[1], at[2], TermRestore}, span{at[2], at[3], TermRestart})
		floor = at[3]
	}
	return out
}

func overlap(a, b span) time.Duration {
	from, to := a.from, a.to
	if b.from.After(from) {
		from = b.from
	}
	if b.to.Before(to) {
		to = b.to
	}
	return max(0, to.Sub(from))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
