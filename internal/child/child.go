// Package child runs the processes of rewind-dev's local clusters (the
// demo's and the goodput benchmark's agents, coordinators and trainers):
// each in its own process group, so that a Ctrl-C in the terminal reaches
// only the parent, which then cleans up, and on Linux killed by the
// kernel if the parent dies first.
package child

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"rewind.dev/rewind/internal/clock"
)

// Proc is a started child process, waited for once in the background.
type Proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and its output is copied
	err  error         // Wait's result, once done is closed
}

// Start starts cmd (in its own process group unless the caller set
// SysProcAttr) and waits for it in the background.
func Start(cmd *exec.Cmd) (*Proc, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = SysProcAttr()
	}
	if err := cmd.Start(); err != nil {
		what := filepath.Base(cmd.Path)
		if len(cmd.Args) > 1 {
			what += " " + cmd.Args[1]
		}
		return nil, fmt.Errorf("starting %s: %w", what, err)
	}
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how the process ended (exec.Cmd.Wait's result); nil until Done.
func (p *Proc) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig unless the process has exited.
func (p *Proc) Signal(sig syscall.Signal) {
	if !p.Exited() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// Kill sends SIGKILL and waits until the process is gone.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop asks the process to exit (SIGTERM), kills it after grace, and
// returns once it is gone.
func (p *Proc) Stop(grace time.Duration) {
	p.Signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		p.Kill()
	}
}

// ErrExited is what Ready returns (wrapped) when the process exits before
// it is ready.
var ErrExited = errors.New("process exited")

// Ready calls ready every 50 ms until it returns nil, the process exits
// (an error wrapping ErrExited, with how it ended and the last answer),
// limit passes or ctx ends.
func (p *Proc) Ready(ctx context.Context, limit time.Duration, ready func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := ready()
		switch {
		case err == nil:
			return nil
		case p.Exited():
			return fmt.Errorf("%w (%v) before it was ready: %v", ErrExited, p.err, err)
		case time.Now().After(deadline):
			return fmt.Errorf("not ready within %v: %w", limit, err)
		}
		if err := clock.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}
