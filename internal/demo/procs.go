package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"time"

	"rewind.dev/rewind/internal/child"
)

// startProc starts exe with args, its output to stdout and stderr.
func startProc(name, exe string, args []string, stdout, stderr io.Writer) (*child.Proc, error) {
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return startCmd(name, cmd)
}

// startCmd starts a prepared command.
func startCmd(name string, cmd *exec.Cmd) (*child.Proc, error) {
	p, err := child.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("demo: %s: %w", name, err)
	}
	return p, nil
}

// errExited is returned by trainer.next once the trainer has exited and
// every line it wrote has been read.
var errExited = errors.New("trainer exited")

// trainer is one run of `rewind-dev demo-train`.
type trainer struct {
	p   *child.Proc
	n   int    // 1 for the first run
	who string // "train#2"
	out *lineBuf
	tl  *timeline
}

// startTrainer starts the next run of the training job.
func (d *demo) startTrainer() (*trainer, error) {
	d.runs++
	t := &trainer{n: d.runs, who: fmt.Sprintf("train#%d", d.runs), out: newLineBuf(), tl: d.tl}
	args := []string{"demo-train", "--socket", d.socket, "--job", jobName,
		"--steps", fmt.Sprint(d.cfg.Steps), "--size", fmt.Sprint(d.cfg.Size), "--step-time", d.cfg.StepTime.String()}
	args = append(args, d.cfg.TrainerArgs...)
	p, err := startProc(t.who, d.exe, args, t.out, &prefixWriter{tl: d.tl, who: t.who})
	if err != nil {
		return nil, err
	}
	t.p = p
	d.procs = append(d.procs, p)
	d.tl.log(t.who, "started: pid %d, training job %q rank 0 of 1 up to step %d", p.Pid(), jobName, d.cfg.Steps)
	return t, nil
}

// next returns the trainer's next event and prints it on the timeline. It
// returns an error wrapping errExited once the trainer has exited and all
// its lines are read, and gives up after timeout.
func (t *trainer) next(ctx context.Context, timeout time.Duration) (Event, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		if l, ok := t.out.take(); ok {
			t.tl.at(l.at, t.who, "%s", l.text)
			e, err := ParseEvent(l.text)
			e.At = l.at
			return e, err
		}
		select {
		case <-t.out.notify:
		case <-t.p.Done():
			if t.out.pending() { // written before the exit, not yet taken
				continue
			}
			return Event{}, fmt.Errorf("%s: %w (%v)", t.who, errExited, t.p.Err())
		case <-ctx.Done():
			return Event{}, ctx.Err()
		case <-timer.C:
			return Event{}, fmt.Errorf("demo: %s reported nothing for %v", t.who, timeout)
		}
	}
}
