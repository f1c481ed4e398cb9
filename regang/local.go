package regang

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// Local supervises a job's ranks as processes of this machine, one per
// rank, each attached to the agent of the node it runs on. On a recovery
// it kills every rank still running (they were told the gang is broken,
// but one stuck in a collective may never ask) and starts them all on the
// new placement, resuming from the recovery's step.
type Local struct {
	// Command returns the process of rank of a gang of worldSize ranks on
	// node; restoreStep < 0 means a fresh start (the rank resumes from the
	// job's latest consistent step, if any). A world size other than the
	// one the step was saved at (an elastic recovery) means the rank
	// restores its part of the step by resharding.
	Command func(rank, worldSize uint32, node string, restoreStep int64) *exec.Cmd
	// Started, when set, is told of every rank process started, and
	// Exited of every one that exited by itself (not killed by Local).
	Started func(rank uint32, node string, cmd *exec.Cmd)
	Exited  func(rank uint32, err error)

	mu        sync.Mutex
	placement map[uint32]string
	procs     map[uint32]*rankProc
}

// ExitGangBroken is the exit status of a rank that stopped because the SDK
// told it its gang is broken (sdk.ErrGangBroken): not a failure, since the
// recovery restarts it.
const ExitGangBroken = 3

// rankProc is a rank's process; done is closed once it exited, with err.
type rankProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts the ranks of placement, of a gang of worldSize ranks.
func (l *Local) Start(placement map[uint32]string, worldSize uint32, restoreStep int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.placement = maps.Clone(placement)
	if l.procs == nil {
		l.procs = map[uint32]*rankProc{}
	}
	for _, r := range slices.Sorted(maps.Keys(placement)) {
		cmd := l.Command(r, worldSize, placement[r], restoreStep)
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("regang: starting rank %d on %s: %w", r, placement[r], err)
		}
		p := &rankProc{cmd: cmd, done: make(chan struct{})}
		go func() { p.err = cmd.Wait(); close(p.done) }()
		l.procs[r] = p
		if l.Started != nil {
			l.Started(r, placement[r], cmd)
		}
	}
	return nil
}

// Regang kills the ranks still running and starts every rank on the
// event's placement, resuming from its step.
func (l *Local) Regang(ctx context.Context, ev *coordpb.JobEvent) error {
	l.KillAll()
	return l.Start(ev.Placement, WorldSize(ev), ev.Step)
}

// WorldSize is the world size the event's ranks restart at: its own, or
// for an event of a coordinator that does not say, its placement's size.
func WorldSize(ev *coordpb.JobEvent) uint32 {
	if ev.WorldSize != 0 {
		return ev.WorldSize
	}
	return uint32(len(ev.Placement))
}

// KillNode kills the ranks running on node (part of a simulated node
// failure) and returns them.
func (l *Local) KillNode(node string) []uint32 {
	l.mu.Lock()
	var ranks []uint32
	for r, n := range l.placement {
		if n == node {
			ranks = append(ranks, r)
		}
	}
	l.mu.Unlock()
	slices.Sort(ranks)
	l.killAll(ranks)
	return ranks
}

// KillAll kills every rank still running: every process is signalled
// before any is waited for, so a re-gang waits for one exit, not one
// after the other.
func (l *Local) KillAll() {
	l.mu.Lock()
	ranks := slices.Collect(maps.Keys(l.procs))
	l.mu.Unlock()
	l.killAll(ranks)
}

// killAll SIGKILLs the ranks' processes and forgets them (their exits
// are not failures), then waits for them to exit (at most 5 s in all).
func (l *Local) killAll(ranks []uint32) {
	var ps []*rankProc
	l.mu.Lock()
	for _, r := range ranks {
		if p := l.procs[r]; p != nil {
			ps = append(ps, p)
		}
		delete(l.procs, r)
	}
	l.mu.Unlock()
	for _, p := range ps {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	deadline := time.After(5 * time.Second)
	for _, p := range ps {
		select {
		case <-p.done:
		case <-deadline:
			return
		}
	}
}

// Wait waits until every rank has exited by itself, or ctx ends, and
// returns the first error of a rank that failed. Ranks killed by KillNode,
// KillAll or Regang do not count; ranks a Regang starts meanwhile are
// waited for.
func (l *Local) Wait(ctx context.Context) error {
	for {
		l.mu.Lock()
		var r uint32
		var p *rankProc
		for k, x := range l.procs {
			r, p = k, x
			break
		}
		l.mu.Unlock()
		if p == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
		case <-time.After(100 * time.Millisecond): // a regang may have replaced it
			continue
		}
		l.mu.Lock()
		current := l.procs[r] == p
		if current {
			delete(l.procs, r)
		}
		l.mu.Unlock()
		if current && l.Exited != nil {
			l.Exited(r, p.err)
		}
		var exit *exec.ExitError
		if errors.As(p.err, &exit) && exit.ExitCode() == ExitGangBroken {
			continue // it left because its gang broke; the regang restarts it
		}
		if current && p.err != nil {
			return fmt.Errorf("regang: rank %d: %w", r, p.err)
		}
	}
}
