package goodput

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"rewind.dev/rewind/internal/demo"
	"rewind.dev/rewind/internal/localcluster"
	"rewind.dev/rewind/internal/miniotest"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/vfs"
)

// Result is a run's outcome: each configuration's record and breakdown.
type Result struct {
	Seed    uint64
	Records []*Record
	Terms   []Breakdown
}

// Run runs the configurations one after the other, each on a fresh
// cluster with the same fault schedule, and prints their breakdowns and
// the extrapolation.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()>>1 | 1
	}
	exe, rewind, err := localcluster.Binaries(cfg.Exe, cfg.Rewind)
	if err != nil {
		return nil, fmt.Errorf("goodput: %w", err)
	}
	st, err := vfs.Default.Statfs(cfg.ShmDir)
	if err != nil {
		return nil, fmt.Errorf("goodput: %w", err)
	}
	if need := uint64(cfg.Ranks)*8*uint64(cfg.Size) + 64<<20; st.Free < need {
		return nil, fmt.Errorf("goodput: %s has %s free, the run needs %s: pass a smaller --size", cfg.ShmDir, units.Bytes(st.Free), units.Bytes(need))
	}
	kinds := cfg.Faults
	if kinds == nil {
		kinds = slices.Clone(AllFaults)
	}
	_, berr := miniotest.Binary()
	withS3 := berr == nil && !cfg.NoMinIO
	if !withS3 {
		if slices.Contains(kinds, FaultMinIODown) {
			fmt.Fprintln(cfg.Out, "MinIO not built (make minio) or left out: no object-store tier, no minio-down fault")
		}
		kinds = slices.DeleteFunc(kinds, func(k FaultKind) bool { return k == FaultMinIODown })
	}
	if len(kinds) == 0 {
		return nil, errors.New("goodput: no fault kind to inject")
	}
	plan := schedule(cfg, kinds)
	fmt.Fprintf(cfg.Out, "rewind-dev bench goodput: seed %d (replay with --seed %d)\n", cfg.Seed, cfg.Seed)
	fmt.Fprintf(cfg.Out, "%d nodes, %d ranks, %v steps, %s per rank; %v per configuration, a fault every %v on average (%d planned: %s)\n",
		cfg.Nodes, cfg.Ranks, cfg.StepTime, units.Bytes(uint64(cfg.Size)), cfg.Duration, cfg.FaultEvery, len(plan), planString(plan))
	fmt.Fprintf(cfg.Out, "rewind: Save every step into shared memory, 1 peer replica, tiers %s\n", tierPolicy(withS3))
	fmt.Fprintf(cfg.Out, "baseline: as torch.save to shared storage: the whole state written and fsynced every %d steps by every rank, restart from the newest step every rank wrote\n\n", cfg.BaselineEvery)
	res := &Result{Seed: cfg.Seed}
	for _, mode := range []string{modeRewind, modeBaseline} {
		if cfg.Only != "" && cfg.Only != mode {
			continue
		}
		rec, err := runMode(ctx, cfg, mode, exe, rewind, plan)
		if err != nil {
			return res, fmt.Errorf("goodput: %s run: %w", mode, err)
		}
		res.Records = append(res.Records, rec)
		res.Terms = append(res.Terms, Account(rec))
	}
	PrintResult(cfg.Out, cfg, res)
	if cfg.RecordFile != "" {
		b, err := json.MarshalIndent(res.Records, "", " ")
		if err == nil {
			err = os.WriteFile(cfg.RecordFile, b, 0o644)
		}
		if err != nil {
			return res, fmt.Errorf("goodput: writing the records: %w", err)
		}
	}
	return res, nil
}

func planString(plan []planned) string {
	s := ""
	for i, p := range plan {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s at %.0fs", p.kind, p.at.Seconds())
	}
	return s
}

// PrintResult prints each configuration's breakdown side by side, the
// recoveries, and the extrapolation to cfg.Prod.
func PrintResult(w io.Writer, cfg Config, res *Result) {
	fmt.Fprintf(w, "\nwall time of a rank (mean over ranks), from the job's start to its last step:\n")
	fmt.Fprintf(w, "%-38s", "")
	for _, rec := range res.Records {
		fmt.Fprintf(w, " %18s", rec.Mode)
	}
	fmt.Fprintln(w)
	row := func(name string, f func(b Breakdown) string) {
		fmt.Fprintf(w, "%-38s", name)
		for _, b := range res.Terms {
			fmt.Fprintf(w, " %18s", f(b))
		}
		fmt.Fprintln(w)
	}
	row("goodput", func(b Breakdown) string { return fmt.Sprintf("%.2f%%", 100*b.Goodput()) })
	row("wall", func(b Breakdown) string { return fmt.Sprintf("%.1f s", b.Wall.Seconds()) })
	for t := range numTerms {
		row("  "+t.String(), func(b Breakdown) string {
			return fmt.Sprintf("%.1f s %5.2f%%", b.Terms[t].Seconds(), 100*float64(b.Terms[t])/float64(max(1, b.Wall)))
		})
	}
	row("steps kept", func(b Breakdown) string { return fmt.Sprintf("%.1f", b.Steps) })
	row("recoveries (of them, a fault's)", func(b Breakdown) string { return fmt.Sprintf("%d (%d)", b.Recoveries, b.Faulted) })
	row("checkpoint per step", func(b Breakdown) string { return fmtMs(perStep(b, TermCheckpoint)) })
	row("lost per recovery", func(b Breakdown) string { return perRecovery(b, TermLost) })
	row("detection per fault's recovery", func(b Breakdown) string {
		if b.Faulted == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f s", b.Terms[TermDetection].Seconds()/float64(b.Faulted))
	})
	row("restore per recovery", func(b Breakdown) string { return perRecovery(b, TermRestore) })
	row("restart per recovery", func(b Breakdown) string { return perRecovery(b, TermRestart) })
	for _, rec := range res.Records {
		printFaults(w, rec)
	}
	printExtrapolation(w, cfg, res)
}

func perStep(b Breakdown, t Term) time.Duration {
	if b.Steps == 0 {
		return 0
	}
	return time.Duration(float64(b.Terms[t]) / b.Steps)
}

func perRecovery(b Breakdown, t Term) string {
	if b.Recoveries == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f s", b.Terms[t].Seconds()/float64(b.Recoveries))
}

func fmtMs(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

// printFaults lists a configuration's faults and recoveries.
func printFaults(w io.Writer, rec *Record) {
	fmt.Fprintf(w, "\n%s: faults and recoveries (times from the run's start)\n", rec.Mode)
	for i, f := range rec.Faults {
		line := fmt.Sprintf("  %6.1fs %-12s %-10s", f.At.Sub(rec.Start).Seconds(), f.Kind, f.Node)
		for _, r := range rec.Recoveries {
			if r.Fault == i {
				step, first := newGang(rec, r)
				line += fmt.Sprintf(" detected +%.2fs, restored +%.2fs, first step of the new gang +%s: resumed at step %d",
					r.Detected.Sub(f.At).Seconds(), r.Restored.Sub(r.Detected).Seconds(), first, step)
			}
		}
		if f.Err != "" {
			line += " (" + f.Err + ")"
		}
		fmt.Fprintln(w, line)
	}
	for _, f := range rec.Failed {
		fmt.Fprintf(w, "  recovery failed at %s: the job stopped\n", f)
	}
	for _, r := range rec.Recoveries {
		if r.Fault < 0 {
			step, first := newGang(rec, r)
			fmt.Fprintf(w, "  %6.1fs no fault     %-10s declared dead all the same (a busy machine starves failure detection), restored +%.2fs, first step of the new gang +%s: resumed at step %d\n",
				r.Detected.Sub(rec.Start).Seconds(), r.Node, r.Restored.Sub(r.Detected).Seconds(), first, step)
		}
	}
}

// newGang returns, for a recovery, the step its new processes resumed
// from (the lowest) and the time from its restore to the first step every
// one of them finished (the restart, then a step); "-" where none did.
func newGang(rec *Record, r *Recovery) (int64, string) {
	var last, started, reading time.Time
	resumed, all := int64(-1), true
	for _, p := range rec.Procs {
		if p.Started.Before(r.Restored) || p.Started.After(nextRestored(rec, r)) {
			continue
		}
		started = maxTime(started, p.Started)
		var first *demo.Event
		for i, e := range p.Events {
			switch e.Kind {
			case demo.KindFresh, demo.KindResumed:
				if resumed < 0 || e.Step < resumed {
					resumed = e.Step
				}
				reading = maxTime(reading, e.At.Add(-e.Restore))
			case demo.KindSaved, demo.KindSaveFailed:
				if first == nil {
					first = &p.Events[i]
				}
			}
		}
		if first == nil {
			all = false
		} else if first.At.After(last) {
			last = first.At
		}
	}
	if !all || last.IsZero() {
		return resumed, "-"
	}
	return resumed, fmt.Sprintf("%.2fs (every rank started +%.2fs, reading its state +%.2fs)",
		last.Sub(r.Restored).Seconds(), started.Sub(r.Restored).Seconds(), reading.Sub(r.Restored).Seconds())
}

// nextRestored is when the recovery after r restored (far ahead when r
// is the last).
func nextRestored(rec *Record, r *Recovery) time.Time {
	for _, o := range rec.Recoveries {
		if o.Restored.After(r.Restored) {
			return o.Restored
		}
	}
	return r.Restored.Add(24 * time.Hour)
}

// Replay prints the accounting of the records a run wrote (--record),
// with cfg's production scenario.
func Replay(cfg Config, path string) (*Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("goodput: %w", err)
	}
	res := &Result{}
	if err := json.Unmarshal(b, &res.Records); err != nil {
		return nil, fmt.Errorf("goodput: records in %s: %w", path, err)
	}
	for _, rec := range res.Records {
		res.Terms = append(res.Terms, Account(rec))
	}
	PrintResult(cfg.Out, cfg, res)
	return res, nil
}
