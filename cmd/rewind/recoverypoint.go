package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/tiers"
)

// recoveryPoint is how far back a job would go if it lost what is above
// a level: the newest step held there, and when it became consistent.
type recoveryPoint struct {
	Where string // "consistent", "memory of two nodes", or a tier
	Step  int64  // -1: none
	At    time.Time
}

// recoveryPoints returns the job's recovery points: its newest
// consistent step, its newest step in two nodes' memory, and per durable
// tier (those of its policy, and any that holds a copy) its newest step
// with a durable copy there.
func recoveryPoints(job *coordpb.Job, steps []*coordpb.Step) []recoveryPoint {
	at := map[int64]time.Time{}
	newest := map[string]int64{}
	var order []string
	if p, err := tiers.ParsePolicy(job.Policy); err == nil {
		for _, tp := range p.Tiers {
			order = append(order, string(tp.Tier))
		}
	}
	for _, st := range steps {
		if st.ConsistentUnixNano > 0 {
			at[st.Step] = time.Unix(0, st.ConsistentUnixNano)
		}
		for _, tc := range st.Tiers {
			if !slices.Contains(order, tc.Tier) {
				order = append(order, tc.Tier)
			}
			if s, ok := newest[tc.Tier]; tc.State == coordpb.TierCopyState_TIER_COPY_STATE_DURABLE && (!ok || st.Step > s) {
				newest[tc.Tier] = st.Step
			}
		}
	}
	point := func(where string, step int64) recoveryPoint {
		if step < 0 {
			return recoveryPoint{Where: where, Step: -1}
		}
		return recoveryPoint{Where: where, Step: step, At: at[step]}
	}
	out := []recoveryPoint{point("consistent", job.LatestConsistent), point("memory of two nodes", job.Protected)}
	for _, tier := range order {
		s, ok := newest[tier]
		if !ok {
			s = -1
		}
		out = append(out, point(tier, s))
	}
	return out
}

// printRecoveryPoints writes the recovery points as a table, each with
// its age at now.
func printRecoveryPoints(w io.Writer, points []recoveryPoint, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RECOVERY POINT\tSTEP\tAGE")
	for _, p := range points {
		step, age := "-", "none"
		if p.Step >= 0 {
			step, age = fmt.Sprint(p.Step), "-"
			if !p.At.IsZero() {
				age = max(0, now.Sub(p.At)).Round(time.Second).String()
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Where, step, age)
	}
	return tw.Flush()
}
