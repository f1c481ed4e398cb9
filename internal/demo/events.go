package demo

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"rewind.dev/rewind/internal/units"
)

// The trainer reports on stdout, one line per event, in words a person can
// read and the demo can parse:
//
//	fresh step 0 digest 6c1f...
//	resumed step 12 digest 3f2a... restore 40.1 ms
//	step 13 compute 100.2 ms saved 64.0 MiB in 9.1 ms digest 77b0...
//	step 1 compute 100.4 ms saved 64.0 MiB in 35.2 ms cold digest 0d3e...
//	step 14 save failed: rewind: save step 14 ...: agent unavailable
//	done step 30 digest 91ac...
//
// The digest is State.Digest after the step. "cold" marks a save that
// created, resized or newly mapped its segment.

// Kind is what an event reports.
type Kind string

// The kinds of event.
const (
	KindFresh      Kind = "fresh"   // no checkpoint: started from the initial state
	KindResumed    Kind = "resumed" // restored a checkpoint
	KindSaved      Kind = "step"    // a step was computed and saved
	KindSaveFailed Kind = "failed"  // a step was computed, its save failed
	KindDone       Kind = "done"    // the last step is saved
)

// Event is one line of the trainer's report.
type Event struct {
	Kind    Kind
	Step    int64
	Digest  string
	Compute time.Duration // KindSaved: the step's compute
	Save    time.Duration // KindSaved: Save's blocking time
	Restore time.Duration // KindResumed: Restore's time
	Bytes   uint64        // KindSaved: shard size (to 0.1 of its unit)
	Cold    bool          // KindSaved: see above
	Err     string        // KindSaveFailed
	At      time.Time     // when the demo read the line
	Line    string
}

func formatFresh(step int64, digest string) string {
	return fmt.Sprintf("fresh step %d digest %s", step, digest)
}

func formatResumed(step int64, digest string, restore time.Duration) string {
	return fmt.Sprintf("resumed step %d digest %s restore %s ms", step, digest, ms(restore))
}

func formatSaved(step int64, compute time.Duration, bytes int64, save time.Duration, cold bool, digest string) string {
	c := ""
	if cold {
		c = " cold"
	}
	return fmt.Sprintf("step %d compute %s ms saved %s in %s ms%s digest %s", step, ms(compute), units.Bytes(uint64(bytes)), ms(save), c, digest)
}

func formatSaveFailed(step int64, err error) string {
	return fmt.Sprintf("step %d save failed: %s", step, strings.ReplaceAll(err.Error(), "\n", " "))
}

func formatDone(step int64, digest string) string {
	return fmt.Sprintf("done step %d digest %s", step, digest)
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) }

// ParseEvent parses one line of the trainer's report.
func ParseEvent(line string) (Event, error) {
	e := Event{Line: line}
	f := strings.Fields(line)
	bad := func(why string) (Event, error) {
		return Event{}, fmt.Errorf("demo: trainer line %q: %s", line, why)
	}
	if len(f) < 2 {
		return bad("too short")
	}
	e.Kind = Kind(f[0])
	idx := 1
	if e.Kind != KindSaved {
		if f[1] != "step" {
			return bad(`want "step" after the kind`)
		}
		idx = 2
	}
	if len(f) <= idx {
		return bad("no step number")
	}
	step, err := strconv.ParseInt(f[idx], 10, 64)
	if err != nil {
		return bad("step is not a number")
	}
	e.Step = step
	if e.Kind == KindSaved && len(f) > 3 && f[2] == "save" && f[3] == "failed:" {
		e.Kind, e.Err = KindSaveFailed, strings.Join(f[4:], " ")
		return e, nil
	}
	if err := e.parseFields(f[idx+1:]); err != nil {
		return bad(err.Error())
	}
	switch {
	case e.Kind != KindFresh && e.Kind != KindResumed && e.Kind != KindSaved && e.Kind != KindDone:
		return bad("unknown kind")
	case len(e.Digest) != 16:
		return bad("no digest")
	case e.Kind == KindSaved && e.Bytes == 0:
		return bad("no size")
	}
	return e, nil
}

// parseFields reads the "key value [unit]" pairs after the step number.
func (e *Event) parseFields(f []string) error {
	dur := func(j int) (time.Duration, error) {
		if j+1 >= len(f) || f[j+1] != "ms" {
			return 0, fmt.Errorf("%s: want a number of ms", f[j-1])
		}
		v, err := strconv.ParseFloat(f[j], 64)
		return time.Duration(v * 1e6), err
	}
	var err error
	for i := 0; i < len(f) && err == nil; i++ {
		switch f[i] {
		case "digest":
			if i+1 < len(f) {
				e.Digest, i = f[i+1], i+1
			}
		case "cold":
			e.Cold = true
		case "compute", "restore", "in":
			var d time.Duration
			d, err = dur(i + 1)
			switch f[i] {
			case "compute":
				e.Compute = d
			case "restore":
				e.Restore = d
			default:
				e.Save = d
			}
			i += 2
		case "saved":
			if i+2 >= len(f) {
				return fmt.Errorf("saved: no size")
			}
			e.Bytes, err = units.ParseBytes(f[i+1] + f[i+2])
			i += 2
		default:
			return fmt.Errorf("unexpected %q", f[i])
		}
	}
	return err
}
