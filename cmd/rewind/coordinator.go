package main

import (
	"context"
	"log/slog"
	"os"

	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/tiers"
	"rewind.dev/rewind/transport"
)

func runCoordinator(ctx context.Context, args []string) error {
	cfg := coordinator.DefaultConfig()
	fs := newFlagSet("coordinator", "coordinator [flags]", "")
	fs.StringVar(&cfg.ListenAddr, "listen", cfg.ListenAddr, "gRPC address for agents and operators, e.g. :7080 with --tls-dir (without TLS, loopback only unless --insecure)")
	fs.StringVar(&cfg.MetricsAddr, "metrics", cfg.MetricsAddr, "address for Prometheus /metrics: HTTPS with --tls-dir (a reader certificate scrapes), else plaintext HTTP, beyond loopback only with --insecure (empty: off)")
	fs.StringVar(&cfg.DataDir, "data", cfg.DataDir, "directory of the pebble store")
	positiveDuration(fs, &cfg.AgentTimeout, "agent-timeout", "bound on each call to an agent (verify, delete)")
	fs.IntVar(&cfg.RecoveryRetries, "recovery-retries", cfg.RecoveryRetries, "times in a row a recovery that fails after its plan is tried again (after 1 s, doubling to 30 s) before its job waits for a node to come back or an operator (0: none)")
	fs.Func("policy", "tier policy of jobs that set none (default "+cfg.Policy.String()+")", func(v string) error {
		p, err := tiers.ParsePolicy(v)
		cfg.Policy = p
		return err
	})
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "copies of each shard kept in other nodes' memory, for jobs that set none")
	nonNegativeDuration(fs, &cfg.LeaveGrace, "leave-grace", "how long an agent that left gracefully has to come back before its jobs are recovered")
	limitFlag(fs, "max-world-size", "ranks of one job", func(n uint32) { cfg.MaxWorldSize = n }, uint64(cfg.MaxWorldSize))
	limitFlag(fs, "max-jobs", "jobs in the index", func(n uint32) { cfg.MaxJobs = int(n) }, uint64(cfg.MaxJobs))
	limitFlag(fs, "max-steps-per-job", "steps of one job in the index", func(n uint32) { cfg.MaxStepsPerJob = int(n) }, uint64(cfg.MaxStepsPerJob))
	limitFlag(fs, "max-copies-per-shard", "copies of one rank's shard of a step, memory and tiers", func(n uint32) { cfg.MaxCopiesPerShard = int(n) }, uint64(cfg.MaxCopiesPerShard))
	fs.IntVar(&cfg.AuditMaxEntries, "audit-max-entries", cfg.AuditMaxEntries, "entries the audit log keeps; the oldest go first")
	positiveDuration(fs, &cfg.AuditRetention, "audit-retention", "how long the audit log keeps an entry")
	var gf gossipFlags
	gf.register(fs, ":7947", "")
	var kf kubeFlags
	kf.register(fs)
	var ff faultFlags
	ff.register(fs)
	var tlf tlsFlags
	tlf.register(fs)
	var ef coordEnrollFlags
	ef.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := kf.loadJobKey(); err != nil {
		return err
	}
	var err error
	if cfg.Transport, err = tlf.daemonSecurity(cfg.Logger, transport.RoleCoordinator, ""); err != nil {
		return err
	}
	if cfg.Enroll, err = ef.config(&kf); err != nil {
		return err
	}
	g, err := gf.config(tlf.dir, cfg.Logger)
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
	cfg.Registry = daemonRegistry(g)
	c, err := coordinator.New(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	kf.sec = cfg.Transport
	return runWithKube(ctx, c, &kf, cfg.Logger)
}
