package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/units"
)

// A job's steps and a step's copies come from the coordinator a page at
// a time: a listing of a large job (thousands of ranks, each step's
// copies on as many nodes) is more than one answer carries. A listing
// counts each step's copies (coordpb.StepSummary); rewind inspect and
// rewind ls --copies list them.

// eachPage asks for each page of a listing in turn, page given the
// token of the page to ask for ("" the first) and returning the next
// one ("" after the last); what names the listing in the error of a
// coordinator whose tokens do not advance.
func eachPage(what string, page func(token string) (string, error)) error {
	for token := ""; ; {
		next, err := page(token)
		switch {
		case err != nil || next == "":
			return err
		case next == token:
			return fmt.Errorf("the coordinator's %s does not advance past page %q", what, token)
		}
		token = next
	}
}

// listSteps returns job's steps, oldest first, each with its copies
// counted and none listed.
func listSteps(ctx context.Context, c coordpb.CoordinatorClient, job string) ([]*coordpb.Step, error) {
	var out []*coordpb.Step
	err := eachPage("listing of job "+job, func(token string) (string, error) {
		resp, err := c.ListSteps(ctx, &coordpb.ListStepsRequest{Job: job, View: coordpb.StepView_STEP_VIEW_SUMMARY, PageToken: token})
		if err != nil {
			return "", err
		}
		out = append(out, resp.Steps...)
		return resp.NextPageToken, nil
	})
	return out, err
}

// stepPages calls page with each page of job's step in turn: the first
// carries the step's fields and its copies counted, each a page of its
// copies in rank order (Step.Copies).
func stepPages(ctx context.Context, c coordpb.CoordinatorClient, job string, step int64, page func(first bool, st *coordpb.Step) error) error {
	return eachPage(fmt.Sprintf("listing of job %s step %d's copies", job, step), func(token string) (string, error) {
		resp, err := c.InspectStep(ctx, &coordpb.InspectStepRequest{Job: job, Step: step, View: coordpb.StepView_STEP_VIEW_COPIES, PageToken: token})
		if err != nil {
			return "", err
		}
		return resp.NextPageToken, page(token == "", resp.Step)
	})
}

// inspectAll returns job's step with every copy, asked for a page at a
// time.
func inspectAll(ctx context.Context, c coordpb.CoordinatorClient, job string, step int64) (*coordpb.Step, error) {
	var out *coordpb.Step
	err := stepPages(ctx, c, job, step, func(first bool, st *coordpb.Step) error {
		if first {
			out = st
			return nil
		}
		out.Copies = append(out.Copies, st.Copies...)
		return nil
	})
	return out, err
}

// lsSteps prints job's steps: how far back each level would go, then a
// step a line with where its copies are; asJSON, the steps as
// ListStepsResponse, each with every copy when copies is set.
func lsSteps(ctx context.Context, c coordpb.CoordinatorClient, job string, asJSON, copies bool) error {
	steps, err := listSteps(ctx, c, job)
	if err != nil {
		return err
	}
	if asJSON {
		if copies {
			var kept []*coordpb.Step
			for _, st := range steps {
				full, err := inspectAll(ctx, c, job, st.Step)
				switch {
				case status.Code(err) == codes.NotFound:
					continue // deleted since the listing
				case err != nil:
					return err
				}
				kept = append(kept, full)
			}
			steps = kept
		}
		return printJSON(&coordpb.ListStepsResponse{Steps: steps})
	}
	jobs, err := c.ListJobs(ctx, &coordpb.ListJobsRequest{Job: job, View: coordpb.JobView_JOB_VIEW_SUMMARY})
	if err != nil {
		return err
	}
	for _, j := range jobs.Jobs {
		if j.Id == job {
			if err := printRecoveryPoints(os.Stdout, recoveryPoints(j, steps), time.Now()); err != nil {
				return err
			}
			fmt.Println()
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tSTATE\tRANKS\tSIZE\tCOPIES\tTIERS")
	for _, st := range steps {
		state := st.State.Label()
		if st.Unrestorable != nil {
			state += ", unrestorable"
		}
		sum := summaryOf(st)
		fmt.Fprintf(tw, "%d\t%s\t%d/%d\t%s\t%s\t%s\n", st.Step, state, st.RanksCommitted, st.WorldSize, units.Bytes(sum.Bytes), placesCell(sum), tiersSummary(st))
	}
	return tw.Flush()
}

// cellPlaces is how many places a step's COPIES cell names; a step with
// copies in more is shown by tier.
const cellPlaces = 8

// placesCell says where a step's copies are, in a cell: each place with
// its copies ("shm:node-a×4 nvme:node-a×4 shm:node-b(corrupt)×1"), or,
// in more than cellPlaces places, each tier with its copies and nodes
// ("shm×16384 on 8192 nodes").
func placesCell(s *coordpb.StepSummary) string {
	var parts []string
	count := func(where string, c *coordpb.CopyCount) {
		if good := c.Copies - c.Corrupt; good > 0 {
			parts = append(parts, fmt.Sprintf("%s×%d", where, good))
		}
		if c.Corrupt > 0 {
			parts = append(parts, fmt.Sprintf("%s(corrupt)×%d", where, c.Corrupt))
		}
	}
	if s.PlacesTotal <= cellPlaces && len(s.Places) == int(s.PlacesTotal) {
		for _, p := range s.Places {
			count(p.Tier+":"+p.Node, p)
		}
	} else {
		for _, t := range s.Tiers {
			first := len(parts)
			count(t.Tier, t)
			if t.Nodes > 1 && len(parts) > first { // after the tier's first part, its good copies when it has any
				parts[first] += fmt.Sprintf(" on %d nodes", t.Nodes)
			}
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// summaryOf returns the step's copies counted: its summary, or, from a
// coordinator that sends none (one before summaries), its copies counted
// here.
func summaryOf(st *coordpb.Step) *coordpb.StepSummary {
	if st.Summary != nil {
		return st.Summary
	}
	var count coordpb.CopyCounter
	for _, cp := range st.Copies {
		count.Add(cp.Tier, cp.Node, cp.Rank, cp.SizeBytes, cp.State == coordpb.CopyState_COPY_STATE_CORRUPT)
	}
	return count.Summary(0)
}

// inspectStep prints one step of a job: its copies counted, then every
// rank's copies, asked for a page at a time.
func inspectStep(ctx context.Context, o opFlags, job string, step int64) error {
	c, ctx, done, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer done()
	if *o.asJSON {
		st, err := inspectAll(ctx, c, job, step)
		if err != nil {
			return err
		}
		return printJSON(&coordpb.InspectStepResponse{Step: st})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	err = stepPages(ctx, c, job, step, func(first bool, st *coordpb.Step) error {
		if first {
			printStepHead(st)
			fmt.Fprintln(tw, "RANK\tNODE\tTIER\tSIZE\tHEADER CHECKSUM\tSTATE")
		}
		for _, cp := range st.Copies {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", cp.Rank, cp.Node, cp.Tier, units.Bytes(cp.SizeBytes), cp.HeaderChecksum, cp.State.Label())
		}
		return nil
	})
	if ferr := tw.Flush(); err == nil {
		err = ferr
	}
	return err
}

// printStepHead says where a step stands and where its copies are.
func printStepHead(st *coordpb.Step) {
	sum := summaryOf(st)
	fmt.Printf("job %s step %d: %s, %d/%d ranks committed\n", st.Job, st.Step, st.State.Label(), st.RanksCommitted, st.WorldSize)
	fmt.Printf("copies: %d, %s (one per rank: %s): %s\n", sum.Copies, units.Bytes(sum.Bytes), units.Bytes(sum.StepBytes), placesCell(sum))
	if st.Unrestorable != nil {
		fmt.Printf("unrestorable (a restore found at %s): %s\n", time.Unix(0, st.Unrestorable.AtUnixNano).Format(time.DateTime), unrestorableText(st.Unrestorable))
	}
	if len(st.Tiers) > 0 {
		fmt.Printf("tiers: %s\n", tiersSummary(st))
		for _, tc := range st.Tiers {
			if tc.State == coordpb.TierCopyState_TIER_COPY_STATE_CORRUPT {
				fmt.Printf("  %s: %s\n", tc.Tier, tc.Error)
			}
		}
	}
	fmt.Println()
}
