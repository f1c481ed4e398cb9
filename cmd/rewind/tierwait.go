package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/progress"
	"rewind.dev/rewind/internal/units"
)

// pollEvery is how often a wait asks the coordinator again.
const pollEvery = 250 * time.Millisecond

// waitTierCopies waits until no tier copy of job's step is still being
// made, showing their progress (bytes over all of them, rate, time left)
// on a terminal, then prints each copy's outcome. A copy that failed is
// an error.
func waitTierCopies(ctx context.Context, c coordpb.CoordinatorClient, job string, step int64) error {
	p := progress.Stderr(fmt.Sprintf("tier copies of job %s step %d", job, step), 0, 0)
	defer p.Clear()
	for {
		resp, err := c.InspectStep(ctx, &coordpb.InspectStepRequest{Job: job, Step: step, View: coordpb.StepView_STEP_VIEW_SUMMARY})
		if err != nil {
			return err
		}
		done, total, copying := tierProgress(resp.Step)
		p.Set(len(resp.Step.Tiers)-copying, len(resp.Step.Tiers), done, total)
		if copying == 0 {
			p.Clear()
			return printTierCopies(resp.Step)
		}
		if err := clock.Sleep(ctx, pollEvery); err != nil {
			return fmt.Errorf("waiting for the tier copies of job %s step %d: %w", job, step, err)
		}
	}
}

// tierProgress returns the bytes the step's tier copies have moved, the
// bytes they move in all (the step's size on each tier), and how many
// are still being made.
func tierProgress(st *coordpb.Step) (done, total uint64, copying int) {
	size := summaryOf(st).StepBytes
	for _, tc := range st.Tiers {
		total += size
		switch tc.State {
		case coordpb.TierCopyState_TIER_COPY_STATE_COPYING:
			copying++
			done += min(tc.BytesDone, size)
		case coordpb.TierCopyState_TIER_COPY_STATE_DURABLE:
			done += size
		}
	}
	return done, total, copying
}

// printTierCopies prints each tier copy of a step: its state, bytes and
// time; a failed one is an error.
func printTierCopies(st *coordpb.Step) error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIER\tSTATE\tBYTES\tTIME\tERROR")
	var failed []string
	for _, tc := range st.Tiers {
		took := "-"
		if tc.StartedUnixNano > 0 && tc.DoneUnixNano >= tc.StartedUnixNano {
			took = time.Duration(tc.DoneUnixNano - tc.StartedUnixNano).Round(time.Millisecond).String()
		}
		if tc.State == coordpb.TierCopyState_TIER_COPY_STATE_FAILED {
			failed = append(failed, tc.Tier)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", tc.Tier, tc.State.Label(), units.Bytes(tc.BytesDone), took, cell(orDash(tc.Error)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(st.Tiers) == 0 {
		fmt.Printf("job %s step %d has no tier copy (its policy has not made one due)\n", st.Job, st.Step)
	}
	if len(failed) > 0 {
		return fmt.Errorf("job %s step %d: the copy to %v failed", st.Job, st.Step, failed)
	}
	return nil
}
