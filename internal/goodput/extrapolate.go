package goodput

import (
	"fmt"
	"io"
	"time"
)

// Projection is a configuration's goodput extrapolated to a production
// scenario from its measured terms:
//
//	goodput = T/(T+C) · (1 − (D + R + S + L·(T+C)) / F)
//
// T the production step's compute, C the measured in-step checkpoint cost
// per step, D, R and S the measured detection, restore and restart per
// recovery (detection per recovery a fault caused), L the measured work
// lost per recovery in steps, F the job's mean time between failures.
type Projection struct {
	C, D, R, S time.Duration
	L          float64 // steps
	PerFailure time.Duration
	Goodput    float64
	OK         bool // false without a measured recovery
}

// Project extrapolates a breakdown to sc.
func Project(b Breakdown, sc Scenario) Projection {
	p := Projection{C: perStep(b, TermCheckpoint)}
	if b.Recoveries == 0 || b.Steps == 0 {
		return p
	}
	n := time.Duration(b.Recoveries)
	p.R, p.S = b.Terms[TermRestore]/n, b.Terms[TermRestart]/n
	if b.Faulted > 0 { // a live node declared dead has no detection
		p.D = b.Terms[TermDetection] / time.Duration(b.Faulted)
	}
	period := float64(b.Terms[TermCompute]+b.Terms[TermCheckpoint]+b.Terms[TermSync]) / b.Steps
	if period > 0 {
		p.L = float64(b.Terms[TermLost]) / float64(n) / period
	}
	step := sc.StepTime + p.C
	p.PerFailure = p.D + p.R + p.S + time.Duration(p.L*float64(step))
	p.Goodput = float64(sc.StepTime) / float64(step) * (1 - float64(p.PerFailure)/float64(sc.FailureEvery))
	p.OK = true
	return p
}

func printExtrapolation(w io.Writer, cfg Config, res *Result) {
	sc := cfg.Prod
	fmt.Fprintf(w, "\nextrapolated to %d nodes, a node failure every %v (the job's), %v steps, the same state per rank:\n",
		sc.Nodes, sc.FailureEvery, sc.StepTime)
	fmt.Fprintln(w, "  goodput = T/(T+C) · (1 − (D + R + S + L·(T+C)) / F)")
	fmt.Fprintln(w, "  T: a production step's compute; C: in-step checkpoint per step; D, R, S: detection, restore, restart per recovery;")
	fmt.Fprintln(w, "  L: work lost per recovery, in steps; C, D, R, S and L as measured above; F: the job's mean time between failures")
	fmt.Fprintln(w, "  (a per-node MTBF M gives F = M / nodes).")
	for i, b := range res.Terms {
		p := Project(b, sc)
		if !p.OK {
			fmt.Fprintf(w, "  %-9s no recovery measured: no failure terms to extrapolate\n", res.Records[i].Mode)
			continue
		}
		fmt.Fprintf(w, "  %-9s C %s, D %.2f s, R %.2f s, S %.2f s, L %.2f steps: %.2f s per failure, goodput %.3f%%\n",
			res.Records[i].Mode, fmtMs(p.C), p.D.Seconds(), p.R.Seconds(), p.S.Seconds(), p.L, p.PerFailure.Seconds(), 100*p.Goodput)
	}
	fmt.Fprintln(w, "  assumed: detection, restore and restart as measured here (a peer restore moves one node's state whatever the")
	fmt.Fprintln(w, "  job's size; gossip detection grows about as log(nodes)); the baseline's write as measured here, not slowed by")
	fmt.Fprintln(w, "  every node writing to one file system at once; step sync, an artefact of this machine, left out.")
}
