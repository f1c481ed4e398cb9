package demo

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/child"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/localcluster"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/regang"
)

// play trains, kills a node, follows the recovery and checks the result.
func (d *cluster) play(ctx context.Context) error {
	placement := map[uint32]string{}
	for r := range uint32(d.cfg.Ranks) {
		placement[r] = d.lc.Nodes[int(r)%len(d.lc.Nodes)].Name
	}
	d.driver = &regang.Local{Command: d.rankCommand, Exited: func(r uint32, err error) {
		if err != nil {
			d.tl.log(fmt.Sprintf("rank-%d", r), "exited: %v", err)
		}
	}}
	fctx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	go regang.Follow(fctx, d.api, jobName, d.driver, func(ev *coordpb.JobEvent) {
		d.tl.log("driver", "recovery event: %s step %d, %d ranks on %s: every rank restarted", ev.Kind.Label(), ev.Step, regang.WorldSize(ev), placementString(ev.Placement))
		d.events <- ev
	})
	if d.cfg.Elastic > 0 {
		minSize := uint32(d.cfg.Elastic)
		_, err := d.api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: jobName, WorldSize: uint32(d.cfg.Ranks), Placement: placement, MinWorldSize: &minSize})
		if err != nil {
			return fmt.Errorf("demo: registering the job for elastic recovery: %w", err)
		}
		d.tl.log("driver", "job %s registered for elastic recovery: %d ranks, at least %d", jobName, d.cfg.Ranks, minSize)
	}
	if err := d.driver.Start(placement, uint32(d.cfg.Ranks), -1); err != nil {
		return err
	}
	var ev *coordpb.JobEvent
	from := int64(0)
	for k := range d.cfg.Kills {
		var err error
		if ev, err = d.killAndRecover(ctx, k, from); err != nil {
			return err
		}
		from = ev.Step
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := d.driver.Wait(wctx); err != nil {
		return err
	}
	return d.verify(ev)
}

// killAndRecover waits until the job's latest consistent step reaches a
// random step after from, lets a random part of a step pass (so the kill
// lands during a save, a replication or a tier copy), kills a random live
// node, and waits for the job's recovery.
func (d *cluster) killAndRecover(ctx context.Context, k int, from int64) (*coordpb.JobEvent, error) {
	killAt := from + d.cfg.KillMin + d.rng.Int64N(d.cfg.KillMax-d.cfg.KillMin+1)
	var alive []*localcluster.Node
	for _, n := range d.lc.Nodes[1:] { // node-0 stays: it runs the demo's first rank
		if !n.Agent.Exited() {
			alive = append(alive, n)
		}
	}
	victim := alive[d.rng.IntN(len(alive))]
	// The latest consistent step may pass killAt (a step some rank failed
	// to save never completes, and the next one does): judge against
	// what it was.
	killAt, err := d.waitConsistent(ctx, killAt, from)
	if err != nil {
		return nil, err
	}
	if err := clock.Sleep(ctx, time.Duration(d.rng.Int64N(int64(d.cfg.StepTime)+1))); err != nil {
		return nil, err
	}
	d.showTiers(ctx)
	killed := d.killNode(victim)
	select {
	case ev := <-d.events:
		d.showRecovery(ev, killed)
		if !ev.Ok {
			return nil, fmt.Errorf("demo: recovery %d failed: %s", k+1, ev.Error)
		}
		d.check(Check{Name: fmt.Sprintf("recovery %d resumes from a step every rank had committed", k+1), OK: ev.Step >= from && ev.Step <= killAt+1,
			Detail: fmt.Sprintf("step %d; the job was consistent at %d when %s died", ev.Step, killAt, victim.Name)})
		return ev, nil
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("demo: no recovery within 30 s of killing %s", victim.Name)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// rankCommand is the process of a rank; its report is parsed as it comes.
func (d *cluster) rankCommand(rank, worldSize uint32, node string, restoreStep int64) *exec.Cmd {
	size := d.cfg.Size
	if d.cfg.Elastic > 0 { // one model, sharded over the ranks
		size *= int64(d.cfg.Ranks)
	}
	args := []string{"demo-train", "--socket", d.lc.Socket(node), "--job", jobName, "--rank", fmt.Sprint(rank),
		"--world-size", fmt.Sprint(worldSize), "--steps", fmt.Sprint(d.cfg.Steps), "--size", fmt.Sprint(size),
		"--step-time", d.cfg.StepTime.String(), "--restore-step", fmt.Sprint(restoreStep), fmt.Sprintf("--elastic=%t", d.cfg.Elastic > 0)}
	cmd := exec.Command(d.exe, args...)
	cmd.Env = append(os.Environ(), "REWIND_JOB_TOKEN="+d.jobToken) // the agents isolate jobs
	ro := &rankOut{node: node, out: newLineBuf()}
	who := fmt.Sprintf("rank-%d", rank)
	cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = ro.out, &prefixWriter{tl: d.tl, who: who}, child.SysProcAttr()
	d.mu.Lock()
	d.ranks[rank] = ro
	d.mu.Unlock()
	go d.readRank(rank, who, ro)
	return cmd
}

// readRank parses a rank's report and shows its notable lines.
func (d *cluster) readRank(rank uint32, who string, ro *rankOut) {
	for range 100_000 {
		l, ok := ro.out.take()
		if !ok {
			select {
			case <-ro.out.notify:
			case <-time.After(time.Minute):
				return
			}
			continue
		}
		e, err := ParseEvent(l.text)
		if err != nil {
			d.tl.at(l.at, who, "%s", l.text)
			continue
		}
		e.At = l.at
		d.mu.Lock()
		ro.events = append(ro.events, e)
		switch e.Kind {
		case KindFresh, KindResumed:
			ro.start = e
		case KindSaved, KindDone:
			ro.last = e
		}
		d.mu.Unlock()
		if e.Kind != KindSaved || rank == 0 && e.Step%10 == 0 {
			d.tl.at(l.at, who, "%s (on %s)", l.text, ro.node)
		}
	}
}

// waitConsistent waits until the job's latest consistent step reaches
// step and one at or after protected outlives the loss of a node.
func (d *cluster) waitConsistent(ctx context.Context, step, protected int64) (int64, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := d.api.Latest(ctx, &coordpb.LatestRequest{Job: jobName})
		// A node killed before any step of this run outlives it (every
		// rank's shard in two nodes' memory) leaves nothing to recover
		// from memory: the kill waits for such a step too.
		if err == nil && resp.Step >= step && resp.Protected >= max(protected, 0) {
			d.tl.log("coord", "step %d consistent: every rank has committed it", resp.Step)
			return resp.Step, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("demo: the job did not reach step %d within a minute (%v)", step, err)
		}
		if err := clock.Sleep(ctx, 20*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// showTiers prints where the job's latest steps live.
func (d *cluster) showTiers(ctx context.Context) {
	resp, err := d.api.ListSteps(ctx, &coordpb.ListStepsRequest{Job: jobName})
	if err != nil {
		return
	}
	for _, st := range resp.Steps[max(0, len(resp.Steps)-3):] {
		nodes := map[string]bool{}
		for _, c := range st.Copies {
			if c.Tier == "shm" {
				nodes[c.Node] = true
			}
		}
		var tiers []string
		for _, tc := range st.Tiers {
			tiers = append(tiers, tc.Tier+":"+tc.State.Label())
		}
		d.tl.log("coord", "step %d %s: in the memory of %s; tiers %s", st.Step, st.State.Label(),
			strings.Join(slices.Sorted(maps.Keys(nodes)), ", "), orNone(strings.Join(tiers, " ")))
	}
}

func orNone(s string) string {
	if s == "" {
		return "none yet"
	}
	return s
}

// killNode kills a node's agent and ranks and wipes its shared memory.
func (d *cluster) killNode(n *localcluster.Node) time.Time {
	t := time.Now()
	n.Agent.Kill()
	ranks := d.driver.KillNode(n.Name)
	os.RemoveAll(n.ShmRoot)
	d.tl.log("demo", "✗ %s dies: SIGKILL its agent (pid %d) and its ranks %v, its shared memory wiped", n.Name, n.Agent.Pid(), ranks)
	return t
}

// showRecovery prints the recovery's timeline.
func (d *cluster) showRecovery(ev *coordpb.JobEvent, killed time.Time) {
	detected := time.Unix(0, ev.DetectedUnixNano)
	planned := time.Unix(0, ev.PlannedUnixNano)
	restored := time.Unix(0, ev.RestoredUnixNano)
	if !ev.Ok {
		d.tl.log("coord", "recovery failed: %s", ev.Error)
		return
	}
	data := restored.Sub(planned)
	d.tl.at(detected, "coord", "declared dead %d ms after the kill: %s", detected.Sub(killed).Milliseconds(), ev.Reason)
	d.tl.at(planned, "coord", "plan after %d ms: restore step %d; ranks now on %v", planned.Sub(detected).Milliseconds(), ev.Step, placementString(ev.Placement))
	d.tl.at(restored, "coord", "restored %s in %d ms (%s) from %v: every rank's shard is in memory on its node",
		units.Bytes(ev.Bytes), data.Milliseconds(), rate(ev.Bytes, data), ev.Sources)
	// Targets, shown, not checked: this machine may be busy. `rewind-dev bench
	// recovery` measures them.
	d.tl.log("demo", "kill to detection %d ms (target 2000), kill to state restored %d ms (target 5000); training resumes at step %d",
		detected.Sub(killed).Milliseconds(), restored.Sub(killed).Milliseconds(), ev.Step)
}

func placementString(p map[uint32]string) string {
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(p)) {
		parts = append(parts, fmt.Sprintf("%d→%s", r, p[r]))
	}
	return strings.Join(parts, " ")
}

func rate(bytes uint64, d time.Duration) string {
	if d <= 0 || bytes == 0 {
		return "-"
	}
	return units.Bytes(uint64(float64(bytes)/d.Seconds())) + "/s"
}

// verify checks every rank resumed at the recovery's step with the state
// it had there, and finished with the state of an uninterrupted run.
func (d *cluster) verify(ev *coordpb.JobEvent) error {
	if d.cfg.Elastic > 0 {
		return d.verifyElastic(ev)
	}
	for r := range uint32(d.cfg.Ranks) {
		ref, err := RankReference(d.cfg.Size, r, d.cfg.Steps)
		if err != nil {
			return err
		}
		ro := d.drained(r)
		d.check(Check{Name: fmt.Sprintf("rank %d resumes at step %d, bit-identical", r, ev.Step),
			OK:     ro.start.Kind == KindResumed && ro.start.Step == ev.Step && ro.start.Digest == ref[ev.Step],
			Detail: fmt.Sprintf("%q on %s; uninterrupted: digest %s", ro.start.Line, ro.node, ref[ev.Step])})
		d.check(Check{Name: fmt.Sprintf("rank %d ends as an uninterrupted run", r),
			OK:     ro.last.Kind == KindDone && ro.last.Step == d.cfg.Steps && ro.last.Digest == ref[d.cfg.Steps],
			Detail: fmt.Sprintf("%q; uninterrupted: step %d digest %s", ro.last.Line, d.cfg.Steps, ref[d.cfg.Steps])})
	}
	return nil
}

// drained returns a rank's report once its reader has taken every line
// (the process has exited; its last lines may still be in the buffer).
func (d *cluster) drained(r uint32) *rankOut {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		d.mu.Lock()
		ro := d.ranks[r]
		done := ro.last.Kind == KindDone
		d.mu.Unlock()
		if done || !ro.out.pending() && time.Now().After(deadline) {
			return ro
		}
	}
}

// verifyElastic checks that the job shrank, that every rank of the new
// gang resumed at the recovery's step with its rows of the full state
// there, and that each finished with its rows of an uninterrupted run.
func (d *cluster) verifyElastic(ev *coordpb.JobEvent) error {
	world := regang.WorldSize(ev)
	ref, err := ElasticReference(d.cfg.Size*int64(d.cfg.Ranks), world, ev.Step, d.cfg.Steps)
	if err != nil {
		return err
	}
	d.check(Check{Name: fmt.Sprintf("the job shrinks from %d ranks to %d, no fewer than %d", d.cfg.Ranks, world, d.cfg.Elastic),
		OK: world < uint32(d.cfg.Ranks) && world >= uint32(d.cfg.Elastic), Detail: ev.Reason})
	for r := range world {
		ro := d.drained(r)
		d.check(Check{Name: fmt.Sprintf("rank %d of %d resumes at step %d with its rows of the full state", r, world, ev.Step),
			OK:     ro.start.Kind == KindResumed && ro.start.Step == ev.Step && ro.start.Digest == ref[ev.Step][r],
			Detail: fmt.Sprintf("%q on %s; uninterrupted: digest %s", ro.start.Line, ro.node, ref[ev.Step][r])})
		d.check(Check{Name: fmt.Sprintf("rank %d of %d ends with its rows of an uninterrupted run", r, world),
			OK:     ro.last.Kind == KindDone && ro.last.Step == d.cfg.Steps && ro.last.Digest == ref[d.cfg.Steps][r],
			Detail: fmt.Sprintf("%q; uninterrupted: step %d digest %s", ro.last.Line, d.cfg.Steps, ref[d.cfg.Steps][r])})
	}
	return nil
}
