package demo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"rewind.dev/rewind/internal/clock"
)

// eventTimeout bounds the wait for any one line of a trainer: a step, a
// save, a restore or a start-up.
func (d *demo) eventTimeout() time.Duration { return 20*time.Second + 4*d.cfg.StepTime }

// startRun starts a trainer and returns its first event (fresh or resumed).
func (d *demo) startRun(ctx context.Context) (*trainer, Event, error) {
	t, err := d.startTrainer()
	if err != nil {
		return nil, Event{}, err
	}
	e, err := d.next(ctx, t)
	if err != nil {
		return nil, Event{}, err
	}
	return t, e, nil
}

// resumeRun starts a trainer after a kill and checks its resume against
// what the killed run reported.
func (d *demo) resumeRun(ctx context.Context, after string, killed *report) (*trainer, Event, error) {
	t, e, err := d.startRun(ctx)
	if err != nil {
		return nil, Event{}, err
	}
	step, digest := judgeResume(after, killed, e)
	d.check(step)
	d.check(digest)
	return t, e, nil
}

// next reads a trainer's next event and records it.
func (d *demo) next(ctx context.Context, t *trainer) (Event, error) {
	e, err := t.next(ctx, d.eventTimeout())
	if err != nil {
		return e, err
	}
	d.events = append(d.events, e)
	d.times.add(e)
	return e, nil
}

// killAfter lets trainer t run until it reports step at saved, waits a
// random part of a step and calls kill. It returns what t reported,
// including the lines that reached the demo before t died.
func (d *demo) killAfter(ctx context.Context, t *trainer, start Event, at int64, victim string, kill func()) (*report, error) {
	rep := newReport(fmt.Sprintf("run %d", t.n), start)
	var prev, last Event
	for last.Kind != KindSaved || last.Step < at {
		e, err := d.next(ctx, t)
		if err != nil {
			return nil, fmt.Errorf("demo: waiting for step %d: %w", at, err)
		}
		if e.Kind == KindSaveFailed {
			return nil, fmt.Errorf("demo: %s could not save step %d: %s", t.who, e.Step, e.Err)
		}
		rep.add(e)
		if e.Kind == KindSaved {
			prev, last = last, e
		}
	}
	period := last.Compute + last.Save
	if prev.Kind == KindSaved {
		period = last.At.Sub(prev.At)
	}
	delay := time.Duration(d.rng.Int64N(int64(max(period, time.Millisecond))))
	if err := clock.Sleep(ctx, delay); err != nil {
		return nil, err
	}
	killedAt := time.Now()
	kill()
	d.tl.at(killedAt, "chaos", "SIGKILL %s, %s ms after step %d was reported saved (≈ %s)", victim, ms(delay), last.Step, phase(delay, last))
	for {
		e, err := d.next(ctx, t)
		if errors.Is(err, errExited) {
			break
		}
		if err != nil {
			return nil, err
		}
		rep.add(e)
	}
	d.tl.log(t.who, "gone: %v; it last reported step %d saved", t.p.Err(), rep.last)
	return rep, nil
}

// phase guesses where in the next step a kill delay after a step's report
// landed, from that step's compute and save times.
func phase(delay time.Duration, last Event) string {
	next := last.Step + 1
	switch {
	case delay < last.Compute:
		return fmt.Sprintf("in the compute of step %d", next)
	case delay < last.Compute+last.Save:
		return fmt.Sprintf("in the save of step %d", next)
	}
	return fmt.Sprintf("after the save of step %d", next)
}

// finish lets the trainer train to the last step and exit.
func (d *demo) finish(ctx context.Context, t *trainer) error {
	for {
		e, err := d.next(ctx, t)
		if err != nil {
			return err
		}
		if e.Kind == KindSaveFailed {
			return fmt.Errorf("demo: %s could not save step %d: %s", t.who, e.Step, e.Err)
		}
		if e.Kind == KindDone {
			break
		}
	}
	select {
	case <-t.p.Done():
	case <-time.After(d.eventTimeout()):
		return fmt.Errorf("demo: %s reported done but did not exit", t.who)
	case <-ctx.Done():
		return ctx.Err()
	}
	d.check(Check{Name: fmt.Sprintf("the last run trains to step %d and exits 0", d.cfg.Steps),
		OK: t.p.Err() == nil && d.events[len(d.events)-1].Step == d.cfg.Steps, Detail: fmt.Sprintf("exit: %v", exitText(t.p.Err()))})
	return nil
}

func exitText(err error) string {
	if err == nil {
		return "0"
	}
	return err.Error()
}

// compareReference runs the same training in this process, without any
// saving, and checks the runs against it.
func (d *demo) compareReference() error {
	d.tl.log("demo", "computing %d steps of the same training in this process, uninterrupted, nothing saved", d.cfg.Steps)
	t0 := time.Now()
	ref, err := Reference(d.cfg.Size, d.cfg.Steps)
	if err != nil {
		return err
	}
	d.tl.log("demo", "uninterrupted run: step %d digest %s (%s ms)", d.cfg.Steps, ref[d.cfg.Steps], ms(time.Since(t0)))
	final := d.events[len(d.events)-1]
	d.check(Check{Name: "the final digest equals the uninterrupted run's", OK: final.Kind == KindDone && final.Digest == ref[d.cfg.Steps],
		Detail: fmt.Sprintf("%s after step %d; uninterrupted: %s", final.Digest, final.Step, ref[d.cfg.Steps])})
	for i := range d.checks {
		if d.checks[i].pending() {
			resolveRef(&d.checks[i], ref)
			d.tl.log("check", "%s %s: %s", d.checks[i].mark(), d.checks[i].Name, d.checks[i].Detail)
		}
	}
	d.check(judgeAll(d.events, ref))
	return nil
}

// check records a check and prints it, unless it is pending.
func (d *demo) check(c Check) {
	d.checks = append(d.checks, c)
	if c.pending() {
		d.tl.log("check", "… %s: %s", c.Name, c.Detail)
		return
	}
	d.tl.log("check", "%s %s: %s", c.mark(), c.Name, c.Detail)
}

func (d *demo) failed() int {
	n := 0
	for _, c := range d.checks {
		if !c.OK {
			n++
		}
	}
	return n
}

// summary prints every check and the timings.
func (d *demo) summary() {
	d.tl.plain("\nchecks (seed %d):", d.seed)
	for _, c := range d.checks {
		d.tl.plain("  %s %s", c.mark(), c.Name)
		d.tl.plain("      %s", c.Detail)
	}
	if d.times.size > 0 {
		d.times.print(d.tl)
	}
	if n := d.failed(); n > 0 {
		d.tl.plain("\n%d of %d checks FAILED (replay with --seed %d)", n, len(d.checks), d.seed)
		return
	}
	d.tl.plain("\nall %d checks passed in %.1f s", len(d.checks), time.Since(d.tl.start).Seconds())
}
