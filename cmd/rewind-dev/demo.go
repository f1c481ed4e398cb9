package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"rewind.dev/rewind/internal/demo"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/regang"
	"rewind.dev/rewind/sdk"
)

func runDemo(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "single" {
		return runDemoSingle(ctx, args[1:])
	}
	cfg := demo.DefaultClusterConfig()
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "agents (nodes) in the local cluster")
	fs.IntVar(&cfg.Ranks, "ranks", cfg.Ranks, "ranks of the training job")
	fs.Int64Var(&cfg.Steps, "steps", cfg.Steps, "steps the job trains")
	size := fs.String("size", "16MiB", "state per rank, saved every step")
	fs.DurationVar(&cfg.StepTime, "step-time", cfg.StepTime, "simulated compute per step")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of the random choices (0: pick one; the demo prints it)")
	fs.IntVar(&cfg.Kills, "kills", cfg.Kills, "nodes that die, one after the other")
	fs.Int64Var(&cfg.KillMin, "kill-min", cfg.KillMin, "a node dies once the job is consistent at a random step from kill-min")
	fs.Int64Var(&cfg.KillMax, "kill-max", cfg.KillMax, "... to kill-max")
	fs.StringVar(&cfg.ShmDir, "shm-dir", cfg.ShmDir, "tmpfs in which the demo makes the nodes' shared-memory roots")
	fs.BoolVar(&cfg.NoMinIO, "no-minio", false, "leave out the object-store tier even when bin/minio is built")
	fs.BoolVar(&cfg.KeepLogs, "keep-logs", false, "leave the coordinator's and agents' logs behind, for inspection")
	fs.BoolVar(&cfg.Plaintext, "plaintext", false, "run the cluster without TLS (plaintext TCP on loopback); by default every TCP connection is mutual TLS")
	fs.StringVar(&cfg.Rewind, "rewind", "", "the rewind binary the coordinator and agents run (default: rewind beside this binary)")
	fs.IntVar(&cfg.Elastic, "elastic", 0, "elastic recovery: no spare node takes a lost node's ranks, the job shrinks to the live nodes' ranks (at least this many) and reshards its model; 0: off")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: rewind-dev demo [flags]      a local cluster; a node dies and the job recovers\n       rewind-dev demo single [flags]  one agent and one trainer, killed in turn")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	b, err := units.ParseBytes(*size)
	if err != nil {
		return err
	}
	cfg.Size = int64(b)
	return demo.RunCluster(ctx, cfg)
}

// runDemoSingle is the single-node demo: a trainer, then the agent, killed.
func runDemoSingle(ctx context.Context, args []string) error {
	cfg := demo.DefaultConfig()
	fs := flag.NewFlagSet("demo single", flag.ContinueOnError)
	fs.Int64Var(&cfg.Steps, "steps", cfg.Steps, "steps the training job runs")
	size := fs.String("size", "64MiB", "model state saved every step")
	fs.DurationVar(&cfg.StepTime, "step-time", cfg.StepTime, "simulated compute per step")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of the random choices (0: pick one; the demo prints it)")
	fs.Int64Var(&cfg.KillMin, "kill-min", cfg.KillMin, "the trainer is killed after a random step from kill-min")
	fs.Int64Var(&cfg.KillMax, "kill-max", cfg.KillMax, "... to kill-max")
	fs.StringVar(&cfg.ShmDir, "shm-dir", cfg.ShmDir, "tmpfs in which the demo makes its shared-memory root")
	fs.StringVar(&cfg.Rewind, "rewind", "", "the rewind binary the agent runs (default: rewind beside this binary)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b, err := units.ParseBytes(*size)
	if err != nil {
		return err
	}
	cfg.Size = int64(b)
	return demo.Run(ctx, cfg)
}

// runDemoTrain is the demo's training process; `rewind-dev demo` and `rewind node` start it.
func runDemoTrain(ctx context.Context, args []string) error {
	cfg := demo.DefaultTrainConfig()
	fs := flag.NewFlagSet("demo-train", flag.ContinueOnError)
	fs.StringVar(&cfg.Socket, "socket", "", "agent socket")
	fs.StringVar(&cfg.Job, "job", cfg.Job, "job id")
	rank := fs.Uint("rank", 0, "this process's rank")
	world := fs.Uint("world-size", 1, "the job's world size")
	fs.Int64Var(&cfg.RestoreStep, "restore-step", -1, "step to resume from (default: the latest consistent)")
	fs.Int64Var(&cfg.Steps, "steps", cfg.Steps, "train until this step is saved")
	size := fs.String("size", "64MiB", "model state")
	fs.DurationVar(&cfg.StepTime, "step-time", cfg.StepTime, "simulated compute per step")
	fs.StringVar(&cfg.DurableDir, "durable-dir", "", "checkpoint only to this directory, as torch.save to shared storage (the goodput baseline)")
	fs.Int64Var(&cfg.DurableEvery, "durable-every", 10, "with --durable-dir: steps between checkpoints")
	fs.BoolVar(&cfg.PerturbRestore, "perturb-restore", false, "flip a bit after restoring (for the demo's tests)")
	fs.BoolVar(&cfg.Elastic, "elastic", false, "train one global model sharded by rows over the world size (--size is its global size), restoring by resharding")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b, err := units.ParseBytes(*size)
	if err != nil {
		return err
	}
	cfg.Size, cfg.Out, cfg.Rank, cfg.World = int64(b), os.Stdout, uint32(*rank), uint32(*world)
	err = demo.Train(ctx, cfg)
	if errors.Is(err, sdk.ErrGangBroken) {
		fmt.Fprintln(os.Stderr, "rewind-dev demo-train:", err)
		os.Exit(regang.ExitGangBroken) // not a failure: the recovery restarts this rank
	}
	return err
}
