package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/tiers"
)

// runTiers shows each agent's durable tiers: what is moving, how fast, and
// whether transfers fail.
func runTiers(ctx context.Context, args []string) error {
	o := newOpFlags("tiers", "tiers [flags] | tiers --wait JOB STEP")
	wait := o.fs.Bool("wait", false, "wait until the tier copies of JOB STEP being made end, showing their progress on a terminal, and print each one's outcome")
	if err := o.parse(args); err != nil {
		return err
	}
	var job string
	var step int64
	if *wait {
		if o.fs.NArg() != 2 {
			return usageError(o.fs, errors.New("--wait needs JOB and STEP"))
		}
		var err error
		job = o.fs.Arg(0)
		if step, err = parseStep(o.fs.Arg(1)); err != nil {
			return err
		}
	}
	c, ctx, done, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer done()
	if *wait {
		return waitTierCopies(ctx, c, job, step)
	}
	resp, err := c.TierStatus(ctx, &coordpb.TierStatusRequest{})
	if err != nil {
		return err
	}
	if *o.asJSON {
		return printJSON(resp)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tTIER\tSTORE\tSTATE\tQUEUED\tRUNNING\tPROGRESS\tLAST RATE\tERROR")
	for _, n := range resp.Nodes {
		for _, h := range n.Tiers {
			state, progress, rate := "ok", "-", "-"
			if h.Degraded {
				state = "degraded"
			}
			if h.BytesTotal > 0 {
				progress = fmt.Sprintf("%s/%s", units.Bytes(h.BytesDone), units.Bytes(h.BytesTotal))
			}
			if h.BytesPerSec > 0 {
				rate = units.Bytes(uint64(h.BytesPerSec)) + "/s"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", n.Node, h.Tier, h.Store, state, h.Queued, h.Running, progress, rate, h.Error)
		}
	}
	return tw.Flush()
}

// runPolicy shows a job's tier policy, or sets it.
func runPolicy(ctx context.Context, args []string) error {
	o := newOpFlags("policy", "policy [flags] JOB [POLICY]   e.g. 'nvme:every=10,keep=2;pfs:every=100,keep=2;s3:every=30m,keep=3'")
	if err := o.parse(args); err != nil {
		return err
	}
	if o.fs.NArg() < 1 || o.fs.NArg() > 2 {
		return usageError(o.fs, errors.New("need JOB and, to set it, POLICY"))
	}
	job := o.fs.Arg(0)
	if o.fs.NArg() == 2 {
		if _, err := tiers.ParsePolicy(o.fs.Arg(1)); err != nil {
			return err
		}
	}
	c, ctx, done, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer done()
	jobs, err := c.ListJobs(ctx, &coordpb.ListJobsRequest{Job: job, View: coordpb.JobView_JOB_VIEW_SUMMARY})
	if err != nil {
		return err
	}
	for _, j := range jobs.Jobs {
		if j.Id != job {
			continue
		}
		if o.fs.NArg() == 2 {
			if _, err := c.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: job, WorldSize: j.WorldSize, Policy: o.fs.Arg(1)}); err != nil {
				return err
			}
			j.Policy = o.fs.Arg(1)
		}
		if *o.asJSON {
			return printJSON(j)
		}
		fmt.Printf("%s: %s\n", job, j.Policy)
		return nil
	}
	return fmt.Errorf("no job %q on the coordinator", job)
}

// tiersSummary is a step's tier copies in a cell: "nvme:durable s3:copying 3/8".
func tiersSummary(st *coordpb.Step) string {
	var parts []string
	for _, tc := range st.Tiers {
		s := tc.Tier + ":" + tc.State.Label()
		if tc.State == coordpb.TierCopyState_TIER_COPY_STATE_COPYING {
			s += fmt.Sprintf(" %d/%d", tc.RanksDone, st.WorldSize)
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}
