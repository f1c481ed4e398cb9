package chaos

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/demo"
)

// Check is one property verified after a scenario.
type Check struct {
	Name   string
	OK     bool
	Detail string
}

// Fault is one fault a scenario injected.
type Fault struct {
	What string    // "kill node2"
	At   time.Time // when it took effect
	Node string    // the node it hit; empty for the coordinator or MinIO
	// Lost: the node is lost to the job (killed, hung, cut off), so a
	// recovery must follow.
	Lost bool
	// Before is the coordinator's view right before the fault, or, for
	// a fault point armed to fire later (Delayed), right before arming:
	// the job trained on meanwhile.
	Before  *Snapshot
	Delayed bool
	Healed  time.Time // when it was undone; zero if never
	// Joint: the node was lost during the recovery from the lost fault
	// before it; one recovery, the job's last, answers both, and the
	// tries that the second loss made fail are tried again.
	Joint bool
}

// Evidence is everything the checks judge, gathered during a scenario.
type Evidence struct {
	Faults []Fault
	// Recoveries are the job's successful recovery events, in order;
	// Failed the failed ones.
	Recoveries []*coordpb.JobEvent
	Failed     []*coordpb.JobEvent
	Lines      []Line      // every node container's lines
	Snapshots  []*Snapshot // the coordinator's view, polled, in time order
	Final      *Snapshot
	Keep       map[string]int // retention per tier (the job's policy)
	WorldSize  uint32
	Size       int64 // state bytes per rank
	Progress   int64 // steps every rank must train after the last fault
	// Corrupted are steps a scenario destroyed every copy of one rank
	// of: they may leave the tiers, and a restore must pass over them.
	Corrupted []int64
}

// lostBefore returns the nodes lost by fault i, every fault before it
// and the faults joint with it.
func (e *Evidence) lostBefore(i int) map[string]bool {
	down := map[string]bool{}
	for k, f := range e.Faults {
		if k > i && !f.Joint {
			break
		}
		if f.Lost && f.Node != "" {
			down[f.Node] = true
		}
	}
	return down
}

// lostFaults returns the indexes of the faults that lose a node and call
// for a recovery of their own (not Joint).
func (e *Evidence) lostFaults() []int {
	var out []int
	for i, f := range e.Faults {
		if f.Lost && !f.Joint {
			out = append(out, i)
		}
	}
	return out
}

// jointLoss reports whether a node was lost during a recovery (Joint).
func (e *Evidence) jointLoss() bool {
	return slices.ContainsFunc(e.Faults, func(f Fault) bool { return f.Joint })
}

// recoveryOf returns the recovery that answered the k-th lost fault (of
// lostFaults), nil if none came: the k-th, or the job's last for the last
// lost fault when nodes were lost jointly with it.
func (e *Evidence) recoveryOf(k int) *coordpb.JobEvent {
	if k >= len(e.Recoveries) {
		return nil
	}
	if lost := e.lostFaults(); k == len(lost)-1 && e.jointLoss() {
		return e.Recoveries[len(e.Recoveries)-1]
	}
	return e.Recoveries[k]
}

// checkResumed: every lost node was followed by a recovery, after which
// every rank resumed at the recovery's step; a fault that loses no node
// restarted no rank; and after the last fault (and its healing) every
// rank trained on for Progress steps.
func checkResumed(e *Evidence) Check {
	c := Check{Name: "the job resumed and trained on"}
	lost := e.lostFaults()
	var problems []string
	switch {
	case len(e.Failed) > 0 && e.jointLoss() && len(e.Recoveries) > 0:
		// Tries that a node lost during them made fail, tried again: the
		// last recovery's resumption and the progress below judge it.
	case len(e.Failed) > 0:
		problems = append(problems, fmt.Sprintf("recovery failed: %s", e.Failed[0].Error))
	}
	if len(e.Recoveries) < len(lost) {
		problems = append(problems, fmt.Sprintf("%d recoveries for %d lost nodes", len(e.Recoveries), len(lost)))
	}
	evs := events(e.Lines)
	for k, i := range lost {
		ev := e.recoveryOf(k)
		if ev == nil {
			break
		}
		for r := range e.WorldSize {
			if !slices.ContainsFunc(evs, func(l Line) bool {
				return l.Rank == int(r) && l.Event.Kind == demo.KindResumed && l.Event.Step == ev.Step && l.At.After(e.Faults[i].At)
			}) {
				problems = append(problems, fmt.Sprintf("rank %d never resumed step %d after %s", r, ev.Step, e.Faults[i].What))
			}
		}
	}
	if len(lost) == 0 && len(e.Faults) > 0 {
		for _, l := range evs {
			if (l.Event.Kind == demo.KindResumed || l.Event.Kind == demo.KindFresh) && l.At.After(e.Faults[0].At) {
				problems = append(problems, fmt.Sprintf("rank %d restarted (%s) though no node was lost", l.Rank, l.Text))
				break
			}
		}
	}
	base, since := e.progressBase()
	for r := range e.WorldSize {
		top := int64(-1)
		for _, l := range evs {
			if l.Rank == int(r) && l.Event.Kind == demo.KindSaved && l.At.After(since) {
				top = max(top, l.Event.Step)
			}
		}
		if top < base+e.Progress {
			problems = append(problems, fmt.Sprintf("rank %d saved up to step %d after the last fault, want %d", r, top, base+e.Progress))
		}
	}
	c.OK = len(problems) == 0
	c.Detail = strings.Join(problems, "; ")
	if c.OK {
		c.Detail = fmt.Sprintf("%d recoveries; every rank trained %d steps past step %d", len(e.Recoveries), e.Progress, base)
	}
	return c
}

// progressBase returns the step from which every rank must train on, and
// the moment after which its saves count: the last recovery's step, or
// the newest consistent step at the last fault; after the last fault or
// its healing.
func (e *Evidence) progressBase() (int64, time.Time) {
	if len(e.Faults) == 0 {
		return 0, time.Time{}
	}
	last := e.Faults[len(e.Faults)-1]
	since := last.At
	if last.Healed.After(since) {
		since = last.Healed
	}
	if len(e.Recoveries) > 0 {
		return e.Recoveries[len(e.Recoveries)-1].Step, since
	}
	return max(0, last.Before.LatestConsistent()), since
}

// checkDigests: every state a rank reported (started from, restored,
// saved) is bit-identical to the uninterrupted run's at that step. It
// also returns the bytes of restored state so verified.
func checkDigests(e *Evidence, ref *references) (Check, uint64) {
	c := Check{Name: "restored and saved states are bit-identical to the reference run"}
	var n, restored int
	var bad []string
	for _, l := range events(e.Lines) {
		if l.Event.Digest == "" {
			continue
		}
		want, err := ref.digest(uint32(l.Rank), l.Event.Step)
		if err != nil || want != l.Event.Digest {
			bad = append(bad, fmt.Sprintf("rank %d on %s: %q, reference %s", l.Rank, l.Service, l.Text, want))
			continue
		}
		n++
		if l.Event.Kind == demo.KindResumed && (len(e.Faults) == 0 || l.At.After(e.Faults[0].At)) {
			restored++
		}
	}
	c.OK = len(bad) == 0 && n > 0
	switch {
	case len(bad) > 0:
		c.Detail = fmt.Sprintf("%d of %d digests differ; first: %s", len(bad), len(bad)+n, bad[0])
	case n == 0:
		c.Detail = "no rank reported a digest"
	default:
		c.Detail = fmt.Sprintf("%d digests match, %d of them restores after a fault", n, restored)
	}
	return c, uint64(restored) * uint64(e.Size)
}

// checkDurableKept: every step reported durable on a tier before the
// first fault is still durable there at the end, unless retention
// replaced it with Keep newer durable steps. A node-local tier (nvme)
// counts only when no node was lost: a lost node's NVMe is gone with it.
func checkDurableKept(e *Evidence) Check {
	c := Check{Name: "no step reported durable went missing"}
	if len(e.Faults) == 0 || e.Final == nil {
		c.Detail = "no fault"
		return c
	}
	tiersChecked := []string{"s3"}
	if len(e.lostFaults()) == 0 {
		tiersChecked = append(tiersChecked, "nvme")
	}
	reported := map[string]map[int64]bool{}
	for _, s := range append(slices.Clone(e.Snapshots), e.Faults[0].Before) {
		if s == nil || s.At.After(e.Faults[0].At) {
			continue
		}
		for _, t := range tiersChecked {
			if reported[t] == nil {
				reported[t] = map[int64]bool{}
			}
			for _, st := range s.Durable(t) {
				reported[t][st] = true
			}
		}
	}
	var missing []string
	total := 0
	for _, t := range tiersChecked {
		now := e.Final.Durable(t)
		for _, st := range slices.Sorted(maps.Keys(reported[t])) {
			total++
			// A step the scenario corrupted was a newer durable step
			// when retention ran, whether or not it is listed still.
			newer := 0
			for _, s := range slices.Compact(slices.Sorted(slices.Values(slices.Concat(now, e.Corrupted)))) {
				if s > st {
					newer++
				}
			}
			if !slices.Contains(now, st) && newer < max(1, e.Keep[t]) && !slices.Contains(e.Corrupted, st) {
				missing = append(missing, fmt.Sprintf("%s step %d (durable now: %v)", t, st, now))
			}
		}
	}
	c.OK = len(missing) == 0 && total > 0
	switch {
	case len(missing) > 0:
		c.Detail = "missing: " + strings.Join(missing, "; ")
	case total == 0:
		c.Detail = fmt.Sprintf("no step was durable on %v before the fault", tiersChecked)
	default:
		c.Detail = fmt.Sprintf("%d durable copies on %v before the fault: each kept, or replaced by newer ones under retention", total, tiersChecked)
	}
	return c
}

// checkNewestRestorable: every recovery restored a step no older than
// the newest one restorable right before its fault (given the nodes lost
// by then).
func checkNewestRestorable(e *Evidence) Check {
	c := Check{Name: "every restore used the newest restorable step"}
	lost := e.lostFaults()
	if len(lost) == 0 {
		c.OK, c.Detail = true, "no node lost: nothing restored"
		return c
	}
	var parts, bad []string
	for k, i := range lost {
		ev := e.recoveryOf(k)
		if ev == nil {
			bad = append(bad, fmt.Sprintf("no recovery after %s", e.Faults[i].What))
			continue
		}
		want := e.Faults[i].Before.NewestRestorable(e.lostBefore(i))
		got := ev.Step
		parts = append(parts, fmt.Sprintf("step %d (newest restorable before %s: %d)", got, e.Faults[i].What, want))
		excused := func(u *coordpb.UnrestorableStep) bool {
			return u.Step == want && (copyFailed(u) || e.Faults[i].Delayed)
		}
		if got < want && slices.ContainsFunc(ev.Skipped, excused) {
			parts[len(parts)-1] += fmt.Sprintf(", which it reported unrestorable, as %d other steps", len(ev.Skipped)-1)
			continue
		}
		if got < want {
			bad = append(bad, parts[len(parts)-1])
		}
	}
	c.OK = len(bad) == 0
	c.Detail = strings.Join(parts, "; ")
	if !c.OK {
		c.Detail = "older than restorable: " + strings.Join(bad, "; ")
	}
	return c
}

// copyFailed reports whether a step a restore passed over had a copy
// fail (found corrupt, or on a node that went down): a reason for not
// restoring a step that was restorable at the fault. A step whose only
// reason is a rank with no copy left lost its last copies after the
// fault, to the product's own slot reuse or deletion: no excuse, unless
// the fault's view is older than the fault (Delayed), and the ranks
// trained on, reusing slots, in between.
func copyFailed(u *coordpb.UnrestorableStep) bool {
	for _, r := range u.Ranks {
		if slices.ContainsFunc(r.Copies, func(c *coordpb.CopyFailure) bool { return c.Copy != "" }) {
			return true
		}
	}
	return false
}

// checkTierCopiesWhole: a tier copy counts as durable only with every
// rank's shard (its manifest is written last).
func checkTierCopiesWhole(e *Evidence) Check {
	c := Check{Name: "no tier copy is durable without every rank", OK: true}
	n := 0
	for _, st := range e.Final.Steps {
		for _, tc := range st.Tiers {
			if tc.State != coordpb.TierCopyState_TIER_COPY_STATE_DURABLE {
				continue
			}
			n++
			if tc.RanksDone != st.WorldSize {
				c.OK = false
				c.Detail = fmt.Sprintf("step %d on %s is durable with %d of %d ranks", st.Step, tc.Tier, tc.RanksDone, st.WorldSize)
				return c
			}
		}
	}
	c.Detail = fmt.Sprintf("%d durable tier copies, each with all %d ranks", n, e.WorldSize)
	return c
}

// stepsLost returns, per lost node, the steps trained before the fault
// that the recovery rolled back: the newest step any rank reported saved
// before the fault, less the step restored.
func stepsLost(e *Evidence) []int64 {
	var out []int64
	evs := events(e.Lines)
	for k, i := range e.lostFaults() {
		ev := e.recoveryOf(k)
		if ev == nil {
			break
		}
		top := int64(-1)
		for _, l := range evs {
			if l.Event.Kind == demo.KindSaved && l.At.Before(e.Faults[i].At) {
				top = max(top, l.Event.Step)
			}
		}
		out = append(out, max(0, top-ev.Step))
	}
	return out
}

// resumedAfter returns, per lost node, the time from the fault until the
// last rank resumed its recovery's step.
func resumedAfter(e *Evidence) []time.Duration {
	var out []time.Duration
	evs := events(e.Lines)
	for k, i := range e.lostFaults() {
		ev := e.recoveryOf(k)
		if ev == nil {
			break
		}
		var last time.Time
		for r := range e.WorldSize {
			for _, l := range evs {
				if l.Rank == int(r) && l.Event.Kind == demo.KindResumed && l.Event.Step == ev.Step && l.At.After(e.Faults[i].At) {
					if l.At.After(last) {
						last = l.At
					}
					break
				}
			}
		}
		if !last.IsZero() {
			out = append(out, last.Sub(e.Faults[i].At))
		}
	}
	return out
}

// checkStaleQuiet: a node the job was recovered without that comes back
// (thawed, reconnected) commits nothing of the old gang: once it is back,
// it reports no save of a rank that is placed elsewhere.
func checkStaleQuiet(e *Evidence, node string) Check {
	c := Check{Name: "the returned node's old ranks committed nothing"}
	var back time.Time
	for _, f := range e.Faults {
		if f.Node == node && !f.Healed.IsZero() {
			back = f.Healed
		}
	}
	if back.IsZero() || e.Final == nil {
		c.Detail = node + " never came back"
		return c
	}
	placement := e.Final.Placement()
	for _, l := range events(e.Lines) {
		if l.Service == node && l.At.After(back) && l.Event.Kind == demo.KindSaved && placement[uint32(l.Rank)] != node {
			c.Detail = fmt.Sprintf("rank %d (placed on %s) saved on %s after it came back: %q", l.Rank, placement[uint32(l.Rank)], node, l.Text)
			return c
		}
	}
	c.OK = true
	c.Detail = fmt.Sprintf("no save by %s's old ranks after it came back", node)
	return c
}

// EpochsName is the name of the check that no step mixes epochs.
const EpochsName = "no step mixes epochs"

// checkEpochs: every step saved after the last re-gang is of the epoch
// that re-gang raised (a rank the re-gang left behind, cut off or hung,
// wrote none of them), and the job is still at that epoch.
func checkEpochs(e *Evidence) Check {
	c := Check{Name: EpochsName}
	if len(e.Recoveries) == 0 || e.Final == nil || e.Final.Job == nil {
		c.OK, c.Detail = true, "no re-gang to fence"
		return c
	}
	last := e.Recoveries[len(e.Recoveries)-1]
	if e.Final.Job.Epoch != last.Epoch {
		c.Detail = fmt.Sprintf("the job ends at epoch %d; its last re-gang (step %d) raised it to %d", e.Final.Job.Epoch, last.Step, last.Epoch)
		return c
	}
	n := 0
	for _, st := range e.Final.Steps {
		if st.Step <= last.Step {
			continue
		}
		if st.Epoch != last.Epoch {
			c.Detail = fmt.Sprintf("step %d, after the re-gang at step %d to epoch %d, holds shards of epoch %d", st.Step, last.Step, last.Epoch, st.Epoch)
			return c
		}
		n++
	}
	c.OK = true
	c.Detail = fmt.Sprintf("the %d steps after the last re-gang (step %d) are all of its epoch %d", n, last.Step, last.Epoch)
	return c
}
