package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"rewind.dev/rewind/internal/chaos"
)

// runChaos is `rewind-dev chaos`: the fault scenarios against the compose
// cluster (deploy/compose; `make chaos` builds its images first).
func runChaos(ctx context.Context, args []string) error {
	cfg := chaos.DefaultConfig()
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of the random choices (0: pick one; the run prints it)")
	list := fs.String("scenarios", "", "scenarios to run, comma-separated (default: all)")
	fs.BoolVar(&cfg.Smoke, "smoke", false, "only the short subset (a node kill, a MinIO outage)")
	fs.StringVar(&cfg.ComposeFile, "compose-file", cfg.ComposeFile, "the cluster's compose file")
	fs.StringVar(&cfg.Project, "project", cfg.Project, "docker-compose project name")
	fs.BoolVar(&cfg.Keep, "keep", false, "leave the last scenario's cluster running, for inspection")
	fs.StringVar(&cfg.LogDir, "logs", "", "save the containers' logs of every failed scenario under this directory (seed-N/SCENARIO/SERVICE.log)")
	skipNoDocker := fs.Bool("skip-without-docker", false, "print SKIPPED and succeed when no Docker engine answers")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: rewind-dev chaos [flags]\n\nscenarios, each against a fresh cluster:")
		for _, n := range chaos.Names() {
			fmt.Fprintf(fs.Output(), "  %-20s %s\n", n[0], n[1])
		}
		fmt.Fprintln(fs.Output(), "\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *list != "" {
		cfg.Scenarios = strings.Split(*list, ",")
	}
	err := chaos.Run(ctx, cfg)
	if errors.Is(err, chaos.ErrNoDocker) && *skipNoDocker {
		fmt.Printf("chaos: SKIPPED: no Docker engine answers (%v)\n", err)
		return nil
	}
	return err
}

// runChaosTool is `rewind-dev chaos-tool`: what the chaos runner needs done
// inside the cluster's containers, whose images have no shell.
func runChaosTool(ctx context.Context, args []string) error {
	usage := errors.New("usage: rewind-dev chaos-tool fill DIR | unfill DIR | corrupt SHM_ROOT JOB RANK [AFTER_STEP] | corrupt-tier TIER URL S3_ENDPOINT JOB STEP RANK | tier-steps TIER URL S3_ENDPOINT JOB | mkbucket ENDPOINT BUCKET")
	if len(args) < 2 {
		return usage
	}
	switch {
	case args[0] == "fill" && len(args) == 2:
		n, err := chaos.Fill(args[1])
		fmt.Printf("filled %s with %d bytes\n", args[1], n)
		return err
	case args[0] == "unfill" && len(args) == 2:
		return chaos.Unfill(args[1])
	case args[0] == "corrupt" && (len(args) == 4 || len(args) == 5):
		rank, err := strconv.ParseUint(args[3], 10, 32)
		if err != nil {
			return fmt.Errorf("rank %q: %w", args[3], err)
		}
		after := int64(-1)
		if len(args) == 5 {
			if after, err = strconv.ParseInt(args[4], 10, 64); err != nil {
				return fmt.Errorf("after step %q: %w", args[4], err)
			}
		}
		done, err := chaos.Corrupt(args[1], args[2], uint32(rank), after)
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(done)
	case args[0] == "corrupt-tier" && len(args) == 7:
		step, err := strconv.ParseInt(args[5], 10, 64)
		if err != nil {
			return fmt.Errorf("step %q: %w", args[5], err)
		}
		rank, err := strconv.ParseUint(args[6], 10, 32)
		if err != nil {
			return fmt.Errorf("rank %q: %w", args[6], err)
		}
		done, err := chaos.CorruptTier(ctx, args[1], args[2], args[3], args[4], step, uint32(rank))
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(done)
	case args[0] == "tier-steps" && len(args) == 5:
		steps, err := chaos.TierSteps(ctx, args[1], args[2], args[3], args[4])
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(steps)
	case args[0] == "mkbucket" && len(args) == 3:
		if err := chaos.MakeBucket(ctx, args[1], args[2], 2*time.Minute); err != nil {
			return err
		}
		fmt.Fprintf(os.Stdout, "bucket %s ready on %s\n", args[2], args[1])
		return nil
	}
	return usage
}
