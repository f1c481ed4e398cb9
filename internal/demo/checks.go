package demo

import (
	"fmt"
	"slices"
	"time"

	"rewind.dev/rewind/internal/units"
)

// Check is one property the demo verifies.
type Check struct {
	Name   string
	OK     bool
	Detail string
	// RefStep, when RefDigest is set, is a step whose digest can only be
	// judged against the uninterrupted run: the check is pending until
	// resolveRef.
	RefStep   int64
	RefDigest string
}

func (c Check) mark() string {
	if c.OK {
		return "✓"
	}
	return "✗"
}

func (c Check) pending() bool { return c.RefDigest != "" }

// report is what one trainer run reported before it was killed.
type report struct {
	run     string           // "run 1"
	digests map[int64]string // step → digest, for its start and every save it reported
	last    int64            // the latest step it started from or reported saved
}

func newReport(run string, start Event) *report {
	return &report{run: run, digests: map[int64]string{start.Step: start.Digest}, last: start.Step}
}

func (r *report) add(e Event) {
	if e.Kind == KindSaved || e.Kind == KindDone {
		r.digests[e.Step] = e.Digest
		r.last = max(r.last, e.Step)
	}
}

// judgeResume checks the first event of a restarted trainer against the
// report of the run that was killed. The restarted run must resume at the
// last step the killed run reported saved, with the digest it reported;
// or at the step after, when the kill landed after that step's commit but
// before its report, whose digest only the uninterrupted run can judge.
func judgeResume(after string, killed *report, got Event) (step, digest Check) {
	step = Check{Name: "after " + after + ", the new run resumes at the right step"}
	digest = Check{Name: "after " + after + ", the new run resumes with the same state"}
	last := killed.last
	switch {
	case got.Kind != KindResumed:
		step.Detail = fmt.Sprintf("the trainer reported %q, not a resume: the checkpoint of step %d is lost", got.Kind, last)
		digest.Detail = "nothing resumed"
		return step, digest
	case got.Step == last:
		step.OK = true
		step.Detail = fmt.Sprintf("step %d, the last step %s reported saved", got.Step, killed.run)
		digest.OK = got.Digest == killed.digests[last]
		digest.Detail = fmt.Sprintf("digest %s, but %s reported %s for step %d", got.Digest, killed.run, killed.digests[last], last)
		if digest.OK {
			digest.Detail = fmt.Sprintf("digest %s, as %s reported for step %d", got.Digest, killed.run, last)
		}
	case got.Step == last+1:
		step.OK = true
		step.Detail = fmt.Sprintf("step %d: the kill landed after step %d was committed but before %s reported it (step %d was the last reported)",
			got.Step, got.Step, killed.run, last)
		digest.RefStep, digest.RefDigest = got.Step, got.Digest
		digest.Detail = fmt.Sprintf("digest %s; %s never reported step %d: judged against the uninterrupted run at the end", got.Digest, killed.run, got.Step)
	default:
		step.Detail = fmt.Sprintf("step %d; %s last reported step %d saved, so only %d or %d is right", got.Step, killed.run, last, last, last+1)
		digest.Detail = "not judged: wrong step"
	}
	return step, digest
}

// resolveRef judges a pending check against the digests of the
// uninterrupted run (index = step).
func resolveRef(c *Check, ref []string) {
	if !c.pending() {
		return
	}
	want := "(beyond the run)"
	if c.RefStep >= 0 && c.RefStep < int64(len(ref)) {
		want = ref[c.RefStep]
	}
	c.OK = c.RefDigest == want
	c.Detail = fmt.Sprintf("digest %s at step %d; the uninterrupted run has %s", c.RefDigest, c.RefStep, want)
	c.RefDigest = ""
}

// judgeAll checks every digest any run reported against the uninterrupted
// run at the same step.
func judgeAll(events []Event, ref []string) Check {
	c := Check{Name: "every reported digest equals the uninterrupted run's at the same step", OK: true}
	n := 0
	for _, e := range events {
		if e.Digest == "" {
			continue
		}
		n++
		if e.Step < 0 || e.Step >= int64(len(ref)) || ref[e.Step] != e.Digest {
			if c.OK {
				c.Detail = fmt.Sprintf("first mismatch: %q", e.Line)
			}
			c.OK = false
		}
	}
	if c.OK {
		c.Detail = fmt.Sprintf("all %d digests match", n)
	}
	return c
}

// timings summarizes the trainer's saves and restores.
type timings struct {
	size      uint64
	firstCold time.Duration   // the very first save: segment created, sized and mapped
	cold      []time.Duration // later saves that created or newly mapped a segment
	warm      []time.Duration // saves into a segment mapped by an earlier save
	restores  []time.Duration
}

func (t *timings) add(e Event) {
	switch {
	case e.Kind == KindResumed:
		t.restores = append(t.restores, e.Restore)
	case e.Kind != KindSaved:
	case t.size == 0:
		t.size, t.firstCold = e.Bytes, e.Save
	case e.Cold:
		t.cold = append(t.cold, e.Save)
	default:
		t.warm = append(t.warm, e.Save)
	}
}

func (t *timings) print(tl *timeline) {
	list := func(ds []time.Duration) string {
		s := ""
		for i, d := range ds {
			if i > 0 {
				s += ", "
			}
			s += ms(d) + " ms"
		}
		return s
	}
	row := func(label, format string, args ...any) { tl.plain("  %-46s "+format, append([]any{label}, args...)...) }
	tl.plain("\ntimings (%s of state per save):", units.Bytes(t.size))
	row("first save (segment created, sized, mapped)", "%s ms", ms(t.firstCold))
	if len(t.cold) > 0 {
		row("other cold saves (segment new to the process)", "%s", list(t.cold))
	}
	if len(t.warm) > 0 {
		w := slices.Clone(t.warm)
		slices.Sort(w)
		med, p90 := w[len(w)/2], w[len(w)*9/10]
		rate := float64(t.size) / med.Seconds() / (1 << 30)
		row(fmt.Sprintf("warm save, median of %d", len(w)), "%s ms (p90 %s ms, max %s ms) = %.1f GiB/s",
			ms(med), ms(p90), ms(w[len(w)-1]), rate)
	}
	row("restore, every checksum verified", "%s", list(t.restores))
}
