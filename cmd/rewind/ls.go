package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/sdk"
)

func runLs(ctx context.Context, args []string) error {
	o := newOpFlags("ls", "ls [flags] [JOB]")
	fs := o.fs
	socket := fs.String("socket", "", "list what one agent holds, through its socket (default when no coordinator is given: $REWIND_SOCKET or "+sdk.DefaultSocket+")")
	copies := fs.Bool("copies", false, "with JOB and --json: also every copy of each step (as rewind inspect --json shows them), asked for a page at a time")
	asJSON := o.asJSON
	if err := o.parse(args); err != nil {
		return err
	}
	if *o.coordinator != "" && *socket == "" {
		return lsCoordinator(ctx, o, *copies)
	}
	c, err := sdk.Dial(ctx, *socket)
	if err != nil {
		return err
	}
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	shards, err := c.List(ctx, fs.Arg(0))
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"status": st, "shards": shards})
	}
	fmt.Printf("node %s: %s of %s budget in use; %s free on %s (%s)\n\n",
		st.Node, units.Bytes(st.UsedBytes), units.Bytes(st.BudgetBytes), units.Bytes(st.FsFreeBytes), st.ShmRoot, st.Filesystem)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tRANK\tSTEP\tSTATE\tSIZE\tTENSORS\tVERIFIED\tCOMMITTED\tSLOT")
	for _, s := range shards {
		when := "-"
		if s.CommittedUnixNano > 0 {
			when = time.Unix(0, s.CommittedUnixNano).Format(time.DateTime)
		}
		state := s.State.Label()
		if s.Problem != "" {
			state += " (" + s.Problem + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%d\t%v\t%s\t%d\n", s.Job, s.Rank, s.Step, state, units.Bytes(s.SizeBytes), s.Tensors, s.Verified, when, s.Slot)
	}
	return tw.Flush()
}
