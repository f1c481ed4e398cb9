package nodeproc

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/regang"
	"rewind.dev/rewind/sdk"
)

// supervisor runs this node's ranks. Lock order: op, then the Local's own
// lock (its Started callback runs under it), then state.
type supervisor struct {
	cfg   Config
	out   *output
	local *regang.Local
	node  *regang.Node

	op sync.Mutex // serializes starting and killing ranks

	state      sync.Mutex
	ranks      map[uint32]*rankInfo
	lastRegang time.Time
}

// rankInfo is what the supervisor knows of a rank placed on, or run by,
// this node. Guarded by supervisor.state.
type rankInfo struct {
	since   time.Time // its latest start, exit or kill, or when it was first seen placed here
	done    bool      // it trained to the end: never restarted
	strikes int       // reconciles in a row that saw it running but placed elsewhere
}

// Run supervises the node's ranks until ctx ends: it waits for the agent
// and the coordinator, starts the ranks the job has here (or, for a new
// job, the initial ones), follows the job's recoveries and reconciles
// with the coordinator's placement. On return every rank is killed.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	s := &supervisor{cfg: cfg, out: &output{out: cfg.Out}, ranks: map[uint32]*rankInfo{}}
	s.local = &regang.Local{Command: s.command, Started: s.started, Exited: s.exited}
	s.node = &regang.Node{Name: cfg.Node, Local: s.local}
	defer s.local.KillAll()
	if err := s.waitAgent(ctx); err != nil {
		return err
	}
	job, err := s.waitJob(ctx)
	if err != nil {
		return err
	}
	s.op.Lock()
	start := initialRanks(cfg.Node, cfg.InitialRanks, job)
	s.out.printf("node %s, job %s: starting ranks %v (placement known: %v)", cfg.Node, cfg.Job, start, job != nil)
	for _, r := range start {
		if err := s.local.Start(map[uint32]string{r: cfg.Node}, cfg.WorldSize, -1); err != nil {
			s.out.printf("%v", err)
		}
	}
	s.op.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.reap(ctx) })
	wg.Go(func() {
		_ = regang.Follow(ctx, cfg.API, cfg.Job, s, s.observe)
	})
	for clock.Sleep(ctx, cfg.Reconcile) == nil {
		s.reconcile(ctx)
	}
	return nil
}

// initialRanks returns the ranks to start when the supervisor starts: for
// a job the coordinator does not know, the initial ones; otherwise the
// ones it places here, and the initial ones it places nowhere yet (their
// first process has not registered them).
func initialRanks(node string, initial []uint32, job *coordpb.Job) []uint32 {
	set := map[uint32]bool{}
	for _, r := range initial {
		if job == nil || job.Placement[r] == "" || job.Placement[r] == node {
			set[r] = true
		}
	}
	if job != nil {
		for r, n := range job.Placement {
			if n == node {
				set[r] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// waitAgent waits until the agent answers on its socket.
func (s *supervisor) waitAgent(ctx context.Context) error {
	deadline := time.Now().Add(s.cfg.StartTimeout)
	for {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := sdk.Dial(dctx, s.cfg.Socket)
		cancel()
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nodeproc: the agent did not answer on %s within %v: %w", s.cfg.Socket, s.cfg.StartTimeout, err)
		}
		if clock.Sleep(ctx, 100*time.Millisecond) != nil {
			return ctx.Err()
		}
	}
}

// waitJob asks the coordinator for the job until it answers; nil means
// the coordinator does not know the job yet.
func (s *supervisor) waitJob(ctx context.Context) (*coordpb.Job, error) {
	deadline := time.Now().Add(s.cfg.StartTimeout)
	for {
		job, err := s.job(ctx)
		if err == nil {
			return job, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("nodeproc: the coordinator did not answer within %v: %w", s.cfg.StartTimeout, err)
		}
		if clock.Sleep(ctx, 200*time.Millisecond) != nil {
			return nil, ctx.Err()
		}
	}
}

func (s *supervisor) job(ctx context.Context) (*coordpb.Job, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := s.cfg.API.ListJobs(cctx, &coordpb.ListJobsRequest{Job: s.cfg.Job}) // its placement
	if err != nil {
		return nil, err
	}
	for _, j := range resp.Jobs {
		if j.Id == s.cfg.Job {
			return j, nil
		}
	}
	return nil, nil
}

// command is a rank's process: `rewind-dev demo-train` on the node's agent,
// its report prefixed with the rank.
func (s *supervisor) command(rank, worldSize uint32, _ string, restoreStep int64) *exec.Cmd {
	args := append([]string{"demo-train", "--socket", s.cfg.Socket, "--job", s.cfg.Job,
		"--rank", fmt.Sprint(rank), "--world-size", fmt.Sprint(worldSize),
		"--restore-step", fmt.Sprint(restoreStep)}, s.cfg.TrainArgs...)
	cmd := exec.Command(s.cfg.Exe, args...)
	if s.cfg.JobToken != "" {
		cmd.Env = append(os.Environ(), "REWIND_JOB_TOKEN="+s.cfg.JobToken)
	}
	cmd.Stdout = s.out.prefixed(fmt.Sprintf("[rank %d] ", rank))
	cmd.Stderr = s.out.prefixed(fmt.Sprintf("[rank %d stderr] ", rank))
	cmd.SysProcAttr = sysProcAttr()
	return cmd
}

func (s *supervisor) started(rank uint32, _ string, cmd *exec.Cmd) {
	s.out.printf("started rank %d: pid %d, %s", rank, cmd.Process.Pid, strings.Join(cmd.Args[1:], " "))
	s.touch(rank, false)
}

func (s *supervisor) exited(rank uint32, err error) {
	how := "done"
	if err != nil {
		how = err.Error()
	}
	s.out.printf("rank %d exited: %s", rank, how)
	s.touch(rank, err == nil)
}

// touch records a start, exit or kill of rank now.
func (s *supervisor) touch(rank uint32, done bool) {
	s.state.Lock()
	defer s.state.Unlock()
	s.ranks[rank] = &rankInfo{since: time.Now(), done: done}
}

// reap collects the ranks' exits (Local reports them from Wait).
func (s *supervisor) reap(ctx context.Context) {
	for ctx.Err() == nil {
		if err := s.local.Wait(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("rank failed", "err", err)
		}
		_ = clock.Sleep(ctx, 200*time.Millisecond)
	}
}

// Regang is the supervisor as a regang.Driver: it serializes the
// recovery with reconciles, and never stops Follow (an error is logged).
func (s *supervisor) Regang(ctx context.Context, ev *coordpb.JobEvent) error {
	s.op.Lock()
	defer s.op.Unlock()
	s.state.Lock()
	s.lastRegang = time.Now()
	s.state.Unlock()
	if err := s.node.Regang(ctx, ev); err != nil {
		s.out.printf("recovery to step %d: %v", ev.Step, err)
	}
	return nil
}

func (s *supervisor) observe(ev *coordpb.JobEvent) {
	if !ev.Ok {
		s.out.printf("recovery event: %s, step %d, not ok: %s", ev.Kind.Label(), ev.Step, ev.Error)
		return
	}
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(ev.Placement)) {
		parts = append(parts, fmt.Sprintf("%d→%s", r, ev.Placement[r]))
	}
	s.out.printf("recovery event: %s, step %d, placement %s, here %v", ev.Kind.Label(), ev.Step, strings.Join(parts, " "),
		slices.Sorted(maps.Keys(regang.OnNode(ev.Placement, s.cfg.Node))))
}
