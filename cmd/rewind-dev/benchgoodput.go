package main

import (
	"context"
	"flag"
	"os"

	"rewind.dev/rewind/internal/goodput"
	"rewind.dev/rewind/internal/units"
)

func benchGoodput(ctx context.Context, args []string) error {
	cfg := goodput.DefaultConfig()
	fs := flag.NewFlagSet("bench goodput", flag.ContinueOnError)
	fs.Bool("quick", false, "a smoke test of about two minutes: 8 MiB per rank, 50 s per configuration, a fault every 25 s (other flags override)")
	for _, a := range args { // --quick sets the defaults the other flags then change
		if a == "--quick" || a == "-quick" {
			cfg = goodput.QuickConfig()
		}
	}
	fs.IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "agents (nodes) in the local cluster")
	fs.IntVar(&cfg.Ranks, "ranks", cfg.Ranks, "ranks of the training job")
	fs.DurationVar(&cfg.StepTime, "step-time", cfg.StepTime, "simulated compute per step")
	size := fs.String("size", units.Bytes(uint64(cfg.Size)), "state per rank (rewind saves it every step)")
	fs.Int64Var(&cfg.BaselineEvery, "baseline-every", cfg.BaselineEvery, "the baseline's durable checkpoint interval, in steps")
	fs.DurationVar(&cfg.FaultEvery, "fault-every", cfg.FaultEvery, "mean time between faults")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "run time of each configuration")
	fs.DurationVar(&cfg.HealAfter, "heal-after", cfg.HealAfter, "longest wait for a recovery before a lost node is healed or replaced")
	fs.DurationVar(&cfg.MinIODown, "minio-down", cfg.MinIODown, "how long MinIO stays down in its fault")
	faults := fs.String("faults", "", "comma-separated fault kinds to draw from (default: node-kill,hang,partition,agent-crash,minio-down)")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of the fault schedule (0: pick one; printed)")
	fs.StringVar(&cfg.Only, "only", "", "run one configuration: rewind or baseline (default: both)")
	fs.StringVar(&cfg.ShmDir, "shm-dir", cfg.ShmDir, "tmpfs for the nodes' shared memory")
	fs.BoolVar(&cfg.NoMinIO, "no-minio", false, "leave out the object store even when bin/minio is built")
	fs.StringVar(&cfg.RecordFile, "record", "", "write both runs' records (every rank's report, faults, recoveries) as JSON to this file")
	replay := fs.String("from-record", "", "run nothing: print the accounting of the records in this file (written by --record)")
	fs.BoolVar(&cfg.KeepLogs, "keep-logs", false, "keep the daemons' and ranks' logs")
	fs.IntVar(&cfg.Prod.Nodes, "prod-nodes", cfg.Prod.Nodes, "extrapolation: nodes of the production job")
	fs.DurationVar(&cfg.Prod.FailureEvery, "prod-failure-every", cfg.Prod.FailureEvery, "extrapolation: the job's mean time between node failures")
	fs.DurationVar(&cfg.Prod.StepTime, "prod-step-time", cfg.Prod.StepTime, "extrapolation: a production step's compute")
	fs.StringVar(&cfg.Rewind, "rewind", "", "the rewind binary of the coordinator and agents (default: beside this binary)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b, err := units.ParseBytes(*size)
	if err != nil {
		return err
	}
	cfg.Size = int64(b)
	if *faults != "" {
		if cfg.Faults, err = goodput.ParseFaults(*faults); err != nil {
			return err
		}
	}
	cfg.Out = os.Stdout
	if *replay != "" {
		_, err = goodput.Replay(cfg, *replay)
		return err
	}
	_, err = goodput.Run(ctx, cfg)
	return err
}
