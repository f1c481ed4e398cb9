package goodput

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/child"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/demo"
	"rewind.dev/rewind/regang"
)

const jobName = "goodput"

// runner is one configuration's run.
type runner struct {
	cfg     Config
	mode    string
	exe     string
	cl      *cluster
	driver  *regang.Local
	shared  string    // the baseline's shared directory
	rankLog io.Writer // the ranks' standard error
	t0      time.Time

	outMu     sync.Mutex // cfg.Out, written from the fault loop and the follower
	mu        sync.Mutex
	rec       *Record
	live      map[uint32]*liveRank // each rank's current process
	recovered chan *Recovery
}

type liveRank struct {
	node string
	cmd  *exec.Cmd
	proc *RankProc
}

// runMode runs one configuration on a fresh cluster and returns its record.
func runMode(ctx context.Context, cfg Config, mode, exe, rewind string, plan []planned) (*Record, error) {
	cl, err := startCluster(ctx, rewind, cfg.ShmDir, cfg.Nodes, cfg.NoMinIO)
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, mode: mode, exe: exe, cl: cl, shared: filepath.Join(cl.Tmp, "shared"),
		rec: &Record{Mode: mode, StepTime: cfg.StepTime}, live: map[uint32]*liveRank{}, recovered: make(chan *Recovery, 16)}
	logf, err := os.Create(filepath.Join(cl.Tmp, "ranks.log"))
	if err == nil {
		defer logf.Close()
		r.rankLog = logf
	}
	err = r.play(ctx, plan)
	keep := cfg.KeepLogs || err != nil
	if keep {
		if b, jerr := json.MarshalIndent(r.rec, "", " "); jerr == nil {
			_ = os.WriteFile(filepath.Join(cl.Tmp, "record.json"), b, 0o644)
		}
		fmt.Fprintf(cfg.Out, "  %s: logs and the run's record (record.json) kept in %s\n", mode, cl.Tmp)
	}
	cl.Close(keep)
	return r.rec, err
}

// play starts the job, injects the planned faults until the run's
// duration is up, waits for every rank to finish its step, and stops.
func (r *runner) play(ctx context.Context, plan []planned) error {
	r.driver = &regang.Local{Command: r.command}
	fctx, stopFollow := context.WithCancel(ctx)
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		regang.Follow(fctx, r.cl.API, jobName, r.driver, r.observe)
	}()
	defer func() { stopFollow(); <-followed }() // no event observed after the run
	placement := map[uint32]string{}
	for k := range uint32(r.cfg.Ranks) {
		placement[k] = r.cl.Nodes[int(k)%len(r.cl.Nodes)].Name
	}
	r.t0 = wallNow()
	r.rec.Start = r.t0
	if err := r.driver.Start(placement, uint32(r.cfg.Ranks), -1); err != nil {
		return err
	}
	defer r.driver.KillAll()
	for _, pf := range plan {
		if err := clock.Sleep(ctx, time.Until(r.t0.Add(pf.at))); err != nil {
			return err
		}
		r.inject(ctx, pf)
	}
	if err := clock.Sleep(ctx, time.Until(r.t0.Add(r.cfg.Duration))); err != nil {
		return err
	}
	end, deadline := time.Now(), time.Now().Add(r.cfg.Grace)
	err := r.steppedSince(end)
	for err != nil && time.Now().Before(deadline) && clock.Sleep(ctx, 50*time.Millisecond) == nil {
		err = r.steppedSince(end)
	}
	r.mu.Lock()
	r.rec.End = wallNow()
	r.mu.Unlock()
	if err != nil {
		r.log("%v: the run ends without it", err)
	}
	return ctx.Err()
}

// steppedSince says whether every rank's current process has reported a
// step after t.
func (r *runner) steppedSince(t time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range uint32(r.cfg.Ranks) {
		lr := r.live[k]
		if lr == nil {
			return fmt.Errorf("rank %d has no process", k)
		}
		if e := lastStep(lr.proc); e == nil || !e.At.After(t) {
			return fmt.Errorf("rank %d has not finished a step since the end", k)
		}
	}
	return nil
}

// command is the process of a rank (regang.Local's Command).
func (r *runner) command(rank, worldSize uint32, node string, restoreStep int64) *exec.Cmd {
	args := []string{"demo-train", "--socket", r.cl.Socket(node), "--job", jobName, "--rank", fmt.Sprint(rank),
		"--world-size", fmt.Sprint(worldSize), "--steps", "1000000000", "--size", fmt.Sprint(r.cfg.Size),
		"--step-time", r.cfg.StepTime.String(), "--restore-step", fmt.Sprint(restoreStep)}
	if r.mode == modeBaseline {
		args = append(args, "--durable-dir", r.shared, "--durable-every", fmt.Sprint(r.cfg.BaselineEvery))
	}
	cmd := exec.Command(r.exe, args...)
	p := &RankProc{Rank: rank, Node: node, Started: wallNow()}
	cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = &eventWriter{r: r, p: p}, r.rankLog, child.SysProcAttr()
	r.mu.Lock()
	r.rec.Procs = append(r.rec.Procs, p)
	r.live[rank] = &liveRank{node: node, cmd: cmd, proc: p}
	r.mu.Unlock()
	return cmd
}

// observe records the coordinator's recoveries (regang.Follow's observe).
func (r *runner) observe(ev *coordpb.JobEvent) {
	if ev.Kind != coordpb.JobEventKind_JOB_EVENT_KIND_REGANG {
		return
	}
	if !ev.Ok {
		r.mu.Lock()
		r.rec.Failed = append(r.rec.Failed, fmt.Sprintf("%.1fs: %s", time.Since(r.t0).Seconds(), ev.Error))
		r.mu.Unlock()
		r.log("recovery failed: %s", ev.Error)
		return
	}
	rc := &Recovery{Step: ev.Step, Fault: -1, Node: ev.Node, Reason: ev.Reason, Detected: time.Unix(0, ev.DetectedUnixNano),
		Planned: time.Unix(0, ev.PlannedUnixNano), Restored: time.Unix(0, ev.RestoredUnixNano)}
	r.mu.Lock()
	// The fault that caused it: the latest on the node declared dead. A
	// recovery with none declared a live node dead (a busy machine can
	// starve failure detection's probes).
	for i, f := range r.rec.Faults {
		if f.Node == rc.Node && !f.At.After(rc.Detected) {
			rc.Fault = i
		}
	}
	r.rec.Recoveries = append(r.rec.Recoveries, rc)
	r.mu.Unlock()
	r.log("recovery: step %d, detected %s, restored %s after; ranks on %v (%s)", rc.Step, fmtDur(rc.Detected.Sub(r.faultAt(rc.Fault, rc.Detected))),
		fmtDur(rc.Restored.Sub(rc.Detected)), slices.Sorted(maps.Values(ev.Placement)), ev.Reason)
	select {
	case r.recovered <- rc:
	default:
	}
}

func (r *runner) faultAt(i int, def time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i < 0 {
		return def
	}
	return r.rec.Faults[i].At
}

func (r *runner) addFault(f *Fault) {
	r.mu.Lock()
	r.rec.Faults = append(r.rec.Faults, f)
	r.mu.Unlock()
}

func (r *runner) drainRecoveries() {
	for {
		select {
		case <-r.recovered:
		default:
			return
		}
	}
}

// waitRecovery waits for the next recovery, at most limit.
func (r *runner) waitRecovery(ctx context.Context, limit time.Duration) {
	select {
	case <-r.recovered:
	case <-time.After(limit):
		r.log("no recovery within %v", limit)
	case <-ctx.Done():
	}
}

func (r *runner) log(format string, args ...any) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	fmt.Fprintf(r.cfg.Out, "  %-8s %6.1fs  %s\n", r.mode, time.Since(r.t0).Seconds(), fmt.Sprintf(format, args...))
}

// eventWriter parses a rank's report into its process's events, each
// stamped as it arrives.
type eventWriter struct {
	r       *runner
	p       *RankProc
	partial []byte
}

func (w *eventWriter) Write(b []byte) (int, error) {
	now := wallNow()
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		line := string(w.partial[:i])
		w.partial = w.partial[i+1:]
		e, err := demo.ParseEvent(line)
		if err != nil {
			continue
		}
		e.At = now
		w.r.mu.Lock()
		w.p.Events = append(w.p.Events, e)
		w.r.mu.Unlock()
	}
	return len(b), nil
}

// wallNow is the time without its monotonic reading: every time of a
// record is compared with the coordinator's (wall clock) times.
func wallNow() time.Time { return time.Now().Round(0) }

func fmtDur(d time.Duration) string {
	return fmt.Sprintf("%.2fs", d.Seconds())
}
