package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"syscall"
	"time"
)

// proc is a child process: the agent or a trainer.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and its output is read
	err  error         // Wait's result, once done is closed
}

// startProc starts exe with args, in its own process group (a Ctrl-C in
// the terminal reaches the demo, which then cleans up) and, on Linux,
// killed if the demo dies.
func startProc(name, exe string, args []string, stdout, stderr io.Writer) (*proc, error) {
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = sysProcAttr()
	return startCmd(name, cmd)
}

// startCmd starts a prepared command as a proc.
func startCmd(name string, cmd *exec.Cmd) (*proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("demo: starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill() {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// stop asks the process to exit (SIGTERM) and kills it after grace.
func (p *proc) stop(grace time.Duration) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(grace):
		p.kill()
	}
}

// errExited is returned by trainer.next once the trainer has exited and
// every line it wrote has been read.
var errExited = errors.New("trainer exited")

// trainer is one run of `rewind-dev demo-train`.
type trainer struct {
	p   *proc
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
	d.tl.log(t.who, "started: pid %d, training job %q rank 0 of 1 up to step %d", p.pid(), jobName, d.cfg.Steps)
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
		case <-t.p.done:
			if t.out.pending() { // written before the exit, not yet taken
				continue
			}
			return Event{}, fmt.Errorf("%s: %w (%v)", t.who, errExited, t.p.err)
		case <-ctx.Done():
			return Event{}, ctx.Err()
		case <-timer.C:
			return Event{}, fmt.Errorf("demo: %s reported nothing for %v", t.who, timeout)
		}
	}
}
