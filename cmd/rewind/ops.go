package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/progress"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/transport"
)

// opFlags are the flags every operator command against the coordinator takes.
type opFlags struct {
	fs          *flag.FlagSet
	tls         *tlsFlags
	coordinator *string
	asJSON      *bool
	timeout     *time.Duration
}

func newOpFlags(name, usage string) opFlags {
	fs := newFlagSet(name, usage, "")
	def := os.Getenv("REWIND_COORDINATOR")
	timeout := 2 * time.Minute
	o := opFlags{
		fs:          fs,
		tls:         &tlsFlags{},
		coordinator: fs.String("coordinator", def, "coordinator address host:port (default $REWIND_COORDINATOR)"),
		asJSON:      fs.Bool("json", false, "print JSON"),
		timeout:     &timeout,
	}
	positiveDuration(fs, o.timeout, "timeout", "bound on the whole command")
	o.tls.register(fs)
	return o
}

// parse parses flags and positional arguments in any order, so that
// `rewind restore JOB --dry-run` works as well as `rewind restore --dry-run JOB`.
func (o opFlags) parse(args []string) error {
	var pos []string
	for {
		if err := parseFlags(o.fs, args); err != nil {
			return err
		}
		rest := o.fs.Args()
		if len(rest) == 0 {
			break
		}
		if rest[0] == "--" {
			pos = append(pos, rest[1:]...)
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	return parseFlags(o.fs, append([]string{"--"}, pos...))
}

// dial connects to the coordinator named by the flags.
func (o opFlags) dial(ctx context.Context) (coordpb.CoordinatorClient, context.Context, func(), error) {
	if *o.coordinator == "" {
		return nil, nil, nil, errors.New("no coordinator: pass --coordinator host:port or set REWIND_COORDINATOR")
	}
	sec, err := o.tls.security(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return nil, nil, nil, err
	}
	conn, err := sec.NewClient(*o.coordinator, transport.ExpectCoordinator, plaintextHint(sec, *o.coordinator)...)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, *o.timeout)
	return coordpb.NewCoordinatorClient(conn), ctx, func() { cancel(); conn.Close() }, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func parseStep(s string) (int64, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("step %q is not a non-negative number", s)
	}
	return v, nil
}

// lsCoordinator lists jobs, or the steps of one job with where copies
// live (lsSteps); copies: with --json, every copy of each step too.
func lsCoordinator(ctx context.Context, o opFlags, copies bool) error {
	c, ctx, done, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer done()
	if job := o.fs.Arg(0); job != "" {
		return lsSteps(ctx, c, job, *o.asJSON, copies)
	}
	resp, err := c.ListJobs(ctx, &coordpb.ListJobsRequest{View: coordpb.JobView_JOB_VIEW_SUMMARY})
	if err != nil {
		return err
	}
	if *o.asJSON {
		return printJSON(resp)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tWORLD SIZE\tEPOCH\tLATEST CONSISTENT\tPROTECTED\tSTEPS\tTIER POLICY")
	var resized []string
	for _, j := range resp.Jobs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\n", j.Id, worldSizeText(j), j.Epoch, stepOrDash(j.LatestConsistent), stepOrDash(j.Protected), j.Steps, j.Policy)
		if j.WorldSizeReason != "" {
			resized = append(resized, fmt.Sprintf("%s runs at world size %d of %d: %s", j.Id, j.WorldSize, j.FullWorldSize, j.WorldSizeReason))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range resized {
		fmt.Println(r)
	}
	return nil
}

// worldSizeText is a job's world size, with its elastic range when it
// has one ("6 (elastic 4-8)").
func worldSizeText(j *coordpb.Job) string {
	if j.MinWorldSize == 0 {
		return strconv.FormatUint(uint64(j.WorldSize), 10)
	}
	return fmt.Sprintf("%d (elastic %d-%d)", j.WorldSize, j.MinWorldSize, j.FullWorldSize)
}

// stepOrDash formats a step, "-" for none (-1).
func stepOrDash(step int64) string {
	if step < 0 {
		return "-"
	}
	return strconv.FormatInt(step, 10)
}

func runVerify(ctx context.Context, args []string) error {
	o := newOpFlags("verify", "verify [flags] JOB STEP [STEP...]   (STEP: N, or FIRST-LAST)")
	if err := o.parse(args); err != nil {
		return err
	}
	job, specs, err := o.jobSteps()
	if err != nil {
		return err
	}
	c, ctx, done, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer done()
	steps, sizes, err := resolveSteps(ctx, c, job, specs)
	if err != nil {
		return err
	}
	p := progress.Stderr("verifying job "+job, len(steps), sum(sizes))
	defer p.Ticking(tickEvery)()
	var errs []error
	for i, step := range steps {
		resp, err := c.VerifyStep(ctx, &coordpb.StepRequest{Job: job, Step: step})
		if err != nil {
			return err
		}
		p.Above(func() { err = printVerify(resp, job, step, len(steps) > 1, *o.asJSON) })
		if err != nil {
			return err
		}
		p.Add(1, sizes[i])
		if !resp.Ok {
			errs = append(errs, verifyFailed(ctx, c, job, step, resp))
		}
	}
	return errors.Join(errs...)
}

// printVerify prints one step's verification; named, a header names the
// step (one of several).
func printVerify(resp *coordpb.VerifyStepResponse, job string, step int64, named, asJSON bool) error {
	if asJSON {
		return printJSON(resp)
	}
	if named {
		fmt.Printf("job %s step %d:\n", job, step)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RANK\tNODE\tTIER\tSIZE\tRESULT")
	for _, ch := range resp.Checks {
		res := "ok"
		if !ch.Ok {
			res = "FAILED: " + cell(ch.Problem)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", ch.Copy.Rank, ch.Copy.Node, ch.Copy.Tier, units.Bytes(ch.Copy.SizeBytes), res)
	}
	err := tw.Flush()
	if named {
		fmt.Println()
	}
	return err
}

// verifyFailed is the error of a verification that was not clean.
func verifyFailed(ctx context.Context, c coordpb.CoordinatorClient, job string, step int64, resp *coordpb.VerifyStepResponse) error {
	var worldSize uint32 // to name ranks with no copy at all; 0 if the step is gone
	if st, err := c.InspectStep(ctx, &coordpb.InspectStepRequest{Job: job, Step: step, View: coordpb.StepView_STEP_VIEW_SUMMARY}); err == nil {
		worldSize = st.Step.WorldSize
	}
	return verifyVerdict(job, step, worldSize, resp.Checks)
}

// verifyVerdict says what a verification that was not clean found: which
// copies failed, and whether every rank still has a good copy (the step
// stays restorable) or which ranks have none. worldSize 0 means unknown.
func verifyVerdict(job string, step int64, worldSize uint32, checks []*coordpb.CopyCheck) error {
	good, seen := map[uint32]bool{}, map[uint32]int{}
	var bad []string
	for _, ch := range checks {
		r := ch.Copy.GetRank()
		seen[r]++
		if ch.Ok {
			good[r] = true
			continue
		}
		bad = append(bad, fmt.Sprintf("rank %d %s:%s", r, ch.Copy.GetTier(), ch.Copy.GetNode()))
	}
	var lost []string
	for _, r := range slices.Sorted(maps.Keys(seen)) {
		if !good[r] {
			lost = append(lost, fmt.Sprintf("rank %d (%s, all failed)", r, count(seen[r], "copy", "copies")))
		}
	}
	var absent []string
	for r := range worldSize {
		if seen[r] == 0 {
			absent = append(absent, strconv.FormatUint(uint64(r), 10))
		}
	}
	failed := fmt.Sprintf("%d of %d copies failed verification", len(bad), len(checks))
	if len(bad) > 0 {
		failed += " (" + strings.Join(listShort(bad, 8), ", ") + ")"
	}
	switch {
	case len(lost) > 0 || len(absent) > 0:
		var why []string
		if len(lost) > 0 {
			why = append(why, "no good copy of "+strings.Join(listShort(lost, 8), ", "))
		}
		if len(absent) > 0 {
			why = append(why, "no copy at all of rank "+strings.Join(listShort(absent, 8), ", "))
		}
		return fmt.Errorf("job %s step %d cannot be restored: %s; %s", job, step, strings.Join(why, "; "), failed)
	case len(bad) > 0:
		return fmt.Errorf("job %s step %d: %s; every rank still has a good copy, so the step stays restorable", job, step, failed)
	default:
		return fmt.Errorf("job %s step %d did not verify, though every copy checked is good: the coordinator no longer holds every rank's copy", job, step)
	}
}

// listShort returns at most n items of xs, and how many more there are.
func listShort(xs []string, n int) []string {
	if len(xs) <= n {
		return xs
	}
	return append(slices.Clip(xs[:n]), fmt.Sprintf("%d more", len(xs)-n))
}

func runRestore(ctx context.Context, args []string) error {
	o := newOpFlags("restore", "restore [flags] JOB|--job JOB [--step S] [--dry-run] [--force] [--no-restart]")
	step := o.fs.Int64("step", -1, "step to restore (default: the newest restorable step)")
	dry := o.fs.Bool("dry-run", false, "print the plan (and the steps a restart would delete) without acting")
	job := o.fs.String("job", "", "the job (NAMESPACE.NAME for an MPIJob); or give it as the argument")
	force := o.fs.Bool("force", false, "let the restart delete the job's later consistent steps (go back in time)")
	noRestart := o.fs.Bool("no-restart", false, "only put every rank's shard in its node's memory; leave the running ranks alone")
	if err := o.parse(args); err != nil {
		return err
	}
	switch {
	case *job == "" && o.fs.NArg() == 1:
		*job = o.fs.Arg(0)
	case *job == "" || o.fs.NArg() != 0:
		return usageError(o.fs, errors.New("need one JOB, as the argument or --job"))
	}
	c, ctx, done, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer done()
	who := "unknown"
	if u, err := user.Current(); err == nil {
		who = u.Username
	}
	stop := func() {}
	if !*dry {
		stop = progress.Stderr("restoring job "+*job, 0, 0).Ticking(tickEvery)
	}
	plan, err := c.PlanRestore(ctx, &coordpb.PlanRestoreRequest{Job: *job, Step: *step, DryRun: *dry, RequestedBy: who + " via rewind restore",
		Restart: !*noRestart, Force: *force})
	stop()
	if err != nil {
		return err
	}
	if *o.asJSON {
		return printJSON(plan)
	}
	printRestoreHead(plan, !*noRestart)
	if err := printRestorePlan(plan); err != nil {
		return err
	}
	if plan.Executed && !plan.Ok {
		return errors.New("some ranks could not be restored: no rank was switched to the step")
	}
	return nil
}

// count says "1 rank" or "2 ranks": n and the noun's form for it.
func count[N ~int | ~int32 | ~int64 | ~uint32 | ~uint64](n N, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// printRestoreHead says what a restore did or would do.
func printRestoreHead(plan *coordpb.PlanRestoreResponse, restart bool) {
	dropped := "no later step"
	if len(plan.DroppedSteps) > 0 {
		dropped = fmt.Sprintf("later steps %v", plan.DroppedSteps)
	}
	switch {
	case !plan.Executed && restart:
		fmt.Printf("restore plan for job %s: step %d, %s; a restart would delete %s (dry run: nothing moved)\n",
			plan.Job, plan.Step, count(len(plan.Ranks), "rank", "ranks"), dropped)
	case !plan.Executed:
		fmt.Printf("restore plan for job %s: step %d, %s (dry run: nothing moved)\n", plan.Job, plan.Step, count(len(plan.Ranks), "rank", "ranks"))
	case !plan.Ok:
		fmt.Printf("restore of job %s FAILED at step %d, %s in %s: no rank was switched to it\n", plan.Job, plan.Step, count(len(plan.Ranks), "rank", "ranks"),
			time.Duration(plan.Nanos).Round(time.Millisecond))
	default:
		fmt.Printf("restored job %s: step %d, %s in %s: ok\n", plan.Job, plan.Step, count(len(plan.Ranks), "rank", "ranks"),
			time.Duration(plan.Nanos).Round(time.Millisecond))
		if plan.Restarted {
			fmt.Printf("the job's ranks are restarting at step %d; deleted %s\n", plan.Step, dropped)
		}
	}
	for _, u := range plan.Skipped {
		if u.StoreDidNotServe() {
			fmt.Printf("passed over step %d for now, a store not serving it (not marked: a later restore tries it again): %s\n", u.Step, unrestorableText(u))
			continue
		}
		fmt.Printf("passed over step %d, which cannot be restored whole: %s\n", u.Step, unrestorableText(u))
	}
	fmt.Println()
}

// unrestorableText says why a step cannot be restored whole: "rank 0:
// nvme:node-0 corrupt (…); pfs:- corrupt (…)".
func unrestorableText(u *coordpb.UnrestorableStep) string {
	var parts []string
	for _, r := range u.Ranks {
		var cs []string
		for _, c := range r.Copies {
			what := "failed"
			switch {
			case c.Corrupt:
				what = "corrupt"
			case c.Unreachable:
				what = "unreachable"
			}
			cs = append(cs, fmt.Sprintf("%s %s (%s)", c.Copy, what, c.Error))
		}
		parts = append(parts, fmt.Sprintf("rank %d: %s", r.Rank, strings.Join(cs, "; ")))
	}
	if more := int(u.RanksFailed) - len(u.Ranks); more > 0 { // a summary names the first ranks
		parts = append(parts, count(more, "more rank", "more ranks"))
	}
	return strings.Join(parts, "; ")
}

// printRestorePlan prints the plan's ranks, their sources and, once run,
// what served each.
func printRestorePlan(plan *coordpb.PlanRestoreResponse) error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	if plan.Executed {
		fmt.Fprintln(tw, "RANK\tRUNS ON\tFROM\tTIME\tFAILED BEFORE")
	} else {
		fmt.Fprintln(tw, "RANK\tRUNS ON\tSOURCES (in order)")
	}
	for _, r := range plan.Ranks {
		var srcs []string
		for _, s := range r.Sources {
			srcs = append(srcs, s.Tier+":"+s.Node)
		}
		if !plan.Executed {
			fmt.Fprintf(tw, "%d\t%s\t%s\n", r.Rank, orDash(r.TargetNode), strings.Join(srcs, ", "))
			continue
		}
		from := orDash(r.Used)
		if r.Error != "" {
			from = "error: " + r.Error
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", r.Rank, cell(orDash(r.TargetNode)), cell(from), time.Duration(r.Nanos).Round(time.Millisecond), cell(orDash(strings.Join(r.Failed, "; "))))
	}
	return tw.Flush()
}

// cell makes s one cell of a table: an error joined from several (one per
// line) or holding a tab would break the table's rows and columns, so
// line breaks become "; " and tabs spaces.
func cell(s string) string {
	if !strings.ContainsAny(s, "\n\r\t") {
		return s
	}
	lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	return strings.ReplaceAll(strings.Join(lines, "; "), "\t", " ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runDelete(ctx context.Context, args []string) error {
	o := newOpFlags("delete", "delete [flags] JOB STEP [STEP...]   (STEP: N, or FIRST-LAST)")
	force := o.fs.Bool("force", false, "also delete the latest consistent step")
	if err := o.parse(args); err != nil {
		return err
	}
	job, specs, err := o.jobSteps()
	if err != nil {
		return err
	}
	c, ctx, done, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer done()
	steps, sizes, err := resolveSteps(ctx, c, job, specs)
	if err != nil {
		return err
	}
	p := progress.Stderr("deleting job "+job, len(steps), sum(sizes))
	defer p.Ticking(tickEvery)()
	for i, step := range steps {
		resp, err := c.DeleteStep(ctx, &coordpb.DeleteStepRequest{Job: job, Step: step, Force: *force})
		if err != nil {
			if i > 0 {
				return fmt.Errorf("step %d (after deleting %d of %d steps): %w", step, i, len(steps), err)
			}
			return err
		}
		p.Above(func() {
			if *o.asJSON {
				err = printJSON(resp)
			} else {
				fmt.Printf("deleted %s of job %s step %d\n", count(resp.CopiesDeleted, "copy", "copies"), job, step)
			}
		})
		if err != nil {
			return err
		}
		p.Add(1, sizes[i])
	}
	return nil
}
