package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"

	"rewind.dev/rewind/api/coordpb"
)

func runAudit(ctx context.Context, args []string) error {
	o := newOpFlags("audit", "audit [flags]")
	job := o.fs.String("job", "", "only calls naming this job")
	who := o.fs.String("who", "", "only calls whose caller contains this (operator/alice, node/, unauthenticated)")
	since := o.fs.String("since", "", "only calls since this long ago (90m, 24h) or this time (RFC 3339)")
	limit := o.fs.Uint("limit", 100, "the newest this many calls (at most 10000)")
	if err := o.parse(args); err != nil {
		return err
	}
	if o.fs.NArg() != 0 {
		return usageError(o.fs, fmt.Errorf("unexpected argument %q", o.fs.Arg(0)))
	}
	req := &coordpb.AuditRequest{Job: *job, Who: *who, Limit: uint32(min(*limit, 1<<31))}
	if *since != "" {
		t, err := parseSince(*since, time.Now())
		if err != nil {
			return usageError(o.fs, err)
		}
		req.SinceUnixNano = t.UnixNano()
	}
	c, ctx, done, err := o.dial(ctx)
	if err != nil {
		return err
	}
	defer done()
	resp, err := c.Audit(ctx, req)
	if err != nil {
		return err
	}
	if *o.asJSON {
		return printJSON(resp)
	}
	if isTerminal(os.Stdout) {
		return printAuditTable(os.Stdout, resp)
	}
	printAuditPlain(os.Stdout, resp)
	return nil
}

// parseSince reads --since: a duration back from now, or a time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %s: a duration back from now must not be negative", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q is neither a duration (90m) nor an RFC 3339 time (2026-11-27T09:00:00Z)", s)
	}
	return t, nil
}

// isTerminal reports whether f is a terminal: tables are for people,
// plain lines for pipes.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// auditFields are an entry's columns: time, caller, method, job, step,
// node, arguments, outcome.
func auditFields(e *coordpb.AuditEntry) []string {
	step := "-"
	if e.Step != nil {
		step = strconv.FormatInt(*e.Step, 10)
	}
	outcome := codes.Code(e.Code).String()
	if e.Error != "" {
		outcome += ": " + cell(e.Error)
	}
	return []string{time.Unix(0, e.AtUnixNano).UTC().Format("2006-01-02T15:04:05.000Z"), e.Who, path.Base(e.Method),
		orDash(e.Job), step, orDash(e.Node), orDash(cell(e.Detail)), outcome}
}

func printAuditTable(w io.Writer, resp *coordpb.AuditResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tWHO\tMETHOD\tJOB\tSTEP\tNODE\tARGUMENTS\tOUTCOME")
	for _, e := range resp.Entries {
		fmt.Fprintln(tw, strings.Join(auditFields(e), "\t"))
	}
	if int(resp.Matched) > len(resp.Entries) {
		fmt.Fprintf(tw, "(the newest %d of %d matching calls: --limit shows more)\n", len(resp.Entries), resp.Matched)
	}
	return tw.Flush()
}

// printAuditPlain writes one line per call, its fields separated by tabs,
// no header: for grep, cut and awk.
func printAuditPlain(w io.Writer, resp *coordpb.AuditResponse) {
	for _, e := range resp.Entries {
		fmt.Fprintln(w, strings.Join(auditFields(e), "\t"))
	}
}
