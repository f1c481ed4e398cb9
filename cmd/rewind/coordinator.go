package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/tiers"
)

func runCoordinator(ctx context.Context, args []string) error {
	cfg := coordinator.DefaultConfig()
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.StringVar(&cfg.ListenAddr, "listen", cfg.ListenAddr, "gRPC address for agents and operators")
	fs.StringVar(&cfg.MetricsAddr, "metrics", cfg.MetricsAddr, "HTTP address for Prometheus /metrics (empty: off)")
	fs.StringVar(&cfg.DataDir, "data", cfg.DataDir, "directory of the pebble store")
	fs.DurationVar(&cfg.AgentTimeout, "agent-timeout", cfg.AgentTimeout, "bound on each call to an agent (verify, delete)")
	fs.Func("policy", "tier policy of jobs that set none (default "+cfg.Policy.String()+")", func(v string) error {
		p, err := tiers.ParsePolicy(v)
		cfg.Policy = p
		return err
	})
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "copies of each shard kept in other nodes' memory, for jobs that set none")
	fs.DurationVar(&cfg.LeaveGrace, "leave-grace", cfg.LeaveGrace, "how long an agent that left gracefully has to come back before its jobs are recovered")
	var gf gossipFlags
	gf.register(fs, ":7947", "")
	var kf kubeFlags
	kf.register(fs)
	var ff faultFlags
	ff.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	g, err := gf.config()
	if err != nil {
		return err
	}
	if cfg.Faults, err = ff.injector(cfg.Logger); err != nil {
		return err
	}
	cfg.Gossip = g
	cfg.Leading = kf.leadingFunc()
	if g != nil {
		g.Name = "coordinator"
		g.Injector = cfg.Faults
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	return runWithKube(ctx, c, &kf, cfg.Logger)
}
