// Package demo is `rewind-dev demo`: a real agent and a simulated training job,
// each a separate process, the job killed with SIGKILL, then the agent, and
// each time the job's resume checked bit for bit against what it had
// reported and, at the end, against an uninterrupted run of the same
// training. The training job itself (`rewind-dev demo-train`) is Train.
package demo

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"rewind.dev/rewind/internal/child"
	"rewind.dev/rewind/internal/localcluster"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/vfs"
)

const jobName = "demo"

// demo is the state of one run of the demo.
type demo struct {
	cfg                      Config
	exe                      string // rewind-dev: the trainer
	rewind                   string // rewind: the agent
	tl                       *timeline
	rng                      *rand.Rand
	seed                     uint64
	tmpDir                   string // socket and agent log
	shmRoot, socket, logPath string

	agent  *child.Proc
	client *sdk.Client
	procs  []*child.Proc // every process started, for cleanup
	runs   int           // trainer runs started

	checks []Check
	events []Event // every event any trainer reported
	times  timings
}

// Run runs the demo and returns an error if it could not finish or if any
// check failed. Cancelling ctx (Ctrl-C) stops it; its processes and
// directories are removed in every case.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	d := &demo{cfg: cfg, exe: cfg.Exe, tl: newTimeline(cfg.Out), seed: cfg.Seed}
	if d.seed == 0 {
		d.seed = rand.Uint64()>>1 | 1
	}
	d.rng = rand.New(rand.NewPCG(d.seed, 0x72657769_6e64656d)) // "rewindem"
	d.tl.plain("rewind-dev demo: seed %d (replay with --seed %d)", d.seed, d.seed)
	d.tl.plain("one agent, one training process saving %s of state every step for %d steps;\nSIGKILL the trainer, then the agent, and check every resume bit for bit.\n",
		units.Bytes(uint64(cfg.Size)), cfg.Steps)
	err := d.setup()
	if err == nil {
		err = d.play(ctx)
	}
	failed := d.failed()
	interrupted := errors.Is(err, context.Canceled)
	d.cleanup(!interrupted && (err != nil || failed > 0))
	if interrupted {
		d.tl.log("demo", "interrupted")
		return err
	}
	if err != nil && len(d.checks) == 0 {
		return err // nothing ran: no summary to show
	}
	if err != nil {
		d.tl.log("demo", "✗ %v", err)
		d.checks = append(d.checks, Check{Name: "the demo runs to the end", Detail: err.Error()})
	}
	d.summary()
	if err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("demo: %d of %d checks failed", failed, len(d.checks))
	}
	return nil
}

// setup makes the shm root and the directory of socket and log.
func (d *demo) setup() error {
	var err error
	if d.exe, d.rewind, err = localcluster.Binaries(d.exe, d.cfg.Rewind); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	st, err := vfs.Default.Statfs(d.cfg.ShmDir)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	// Two slots of the rank, and room for the agent's records.
	if need := 2*uint64(d.cfg.Size) + 1<<20; st.Free < need {
		return fmt.Errorf("demo: %s has %s free, the demo needs %s (two slots of %s): pass a smaller --size, or enlarge it (docker run --shm-size=1g)",
			d.cfg.ShmDir, units.Bytes(st.Free), units.Bytes(need), units.Bytes(uint64(d.cfg.Size)))
	}
	if d.shmRoot, err = os.MkdirTemp(d.cfg.ShmDir, "rewind-demo-"); err != nil {
		return fmt.Errorf("demo: shm root: %w", err)
	}
	if d.tmpDir, err = os.MkdirTemp("", "rewind-demo-"); err != nil {
		return fmt.Errorf("demo: temporary directory: %w", err)
	}
	d.socket, d.logPath = filepath.Join(d.tmpDir, "agent.sock"), filepath.Join(d.tmpDir, "agent.log")
	d.tl.log("demo", "shm root %s, socket %s", d.shmRoot, d.socket)
	return nil
}

// cleanup stops every process and removes both directories; with showLog
// it first prints the end of the agent's log.
func (d *demo) cleanup(showLog bool) {
	for _, p := range d.procs {
		if p == d.agent {
			p.Stop(3 * time.Second)
		} else {
			p.Kill()
		}
	}
	if d.client != nil {
		d.client.Close()
	}
	if showLog && d.logPath != "" {
		lines := d.agentLog("")
		d.tl.plain("\nlast lines of the agent log (%s):", d.logPath)
		for _, l := range lines[max(0, len(lines)-15):] {
			d.tl.plain("  | %s", l)
		}
	}
	var removed []string
	for _, dir := range []string{d.shmRoot, d.tmpDir} {
		if dir == "" {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			d.tl.log("demo", "could not remove %s: %v", dir, err)
			continue
		}
		removed = append(removed, dir)
	}
	if len(removed) > 0 {
		d.tl.log("demo", "stopped every process, removed %s", strings.Join(removed, " and "))
	}
}

// play runs the three acts of the demo.
func (d *demo) play(ctx context.Context) error {
	if err := d.startAgent(ctx); err != nil {
		return err
	}
	// Act 1: the training process dies; the agent keeps its checkpoint.
	t, start, err := d.startRun(ctx)
	if err != nil {
		return err
	}
	d.check(Check{Name: "run 1 starts from scratch", OK: start.Kind == KindFresh && start.Step == 0,
		Detail: fmt.Sprintf("%s step %d in a new shm root", start.Kind, start.Step)})
	killAt := d.cfg.KillMin + d.rng.Int64N(d.cfg.KillMax-d.cfg.KillMin+1)
	victim := fmt.Sprintf("the trainer (pid %d)", t.p.Pid())
	rep, err := d.killAfter(ctx, t, start, killAt, victim, func() { t.p.Kill() })
	if err != nil {
		return err
	}
	if err := d.listShards(ctx); err != nil {
		return err
	}
	// Act 2: a new process resumes; then the agent dies, and the trainer.
	if t, start, err = d.resumeRun(ctx, "the trainer's SIGKILL", rep); err != nil {
		return err
	}
	killAt = min(start.Step+2+d.rng.Int64N(4), d.cfg.Steps-2)
	if killAt <= start.Step {
		return fmt.Errorf("demo: resumed at step %d, too late to crash the agent before step %d", start.Step, d.cfg.Steps)
	}
	agent := d.agent
	victim = fmt.Sprintf("the agent (pid %d), then the trainer (pid %d)", agent.Pid(), t.p.Pid())
	rep, err = d.killAfter(ctx, t, start, killAt, victim, func() { agent.Kill(); t.p.Kill() })
	if err != nil {
		return err
	}
	d.tl.log("agent", "gone: %v; restarting it on the same shm root", agent.Err())
	d.client.Close()
	d.client = nil
	if err := d.startAgent(ctx); err != nil {
		return err
	}
	d.showReindex()
	if err := d.listShards(ctx); err != nil {
		return err
	}
	// Act 3: resume again and train to the end.
	if t, _, err = d.resumeRun(ctx, "the agent's SIGKILL", rep); err != nil {
		return err
	}
	if err := d.finish(ctx, t); err != nil {
		return err
	}
	return d.compareReference()
}
