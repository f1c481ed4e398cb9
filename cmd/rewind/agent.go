package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/transport"
)

func runAgent(ctx context.Context, args []string) error {
	cfg := agent.DefaultConfig()
	fs := newFlagSet("agent", "agent [flags]", "")
	fs.StringVar(&cfg.Node, "node", cfg.Node, "name of this node")
	fs.StringVar(&cfg.ShmRoot, "shm-root", cfg.ShmRoot, "directory on tmpfs that holds the segments")
	fs.StringVar(&cfg.Socket, "socket", cfg.Socket, "Unix socket for the SDK")
	fs.StringVar(&cfg.SocketGroup, "socket-group", cfg.SocketGroup, "group allowed to use the sockets (default: owner only); segments stay the agent's")
	jobKey := fs.String("job-key", "", "job key file (rewind job-token --new): a rank reaches its job's checkpoints only with the job's token (empty: jobs are not isolated)")
	fs.StringVar(&cfg.ListenAddr, "listen", cfg.ListenAddr, "TCP address for peers and the coordinator, e.g. :7070 with --tls-dir (empty: off; without TLS, loopback only unless --insecure)")
	fs.StringVar(&cfg.MetricsAddr, "metrics", cfg.MetricsAddr, "address for Prometheus /metrics: HTTPS with --tls-dir (a reader certificate scrapes), else plaintext HTTP, beyond loopback only with --insecure (empty: off)")
	fs.StringVar(&cfg.CoordinatorAddr, "coordinator", cfg.CoordinatorAddr, "coordinator address host:port (empty: this agent alone)")
	fs.StringVar(&cfg.AdvertiseAddr, "advertise", cfg.AdvertiseAddr, "address the coordinator and peers reach this agent's --listen at (default: node name and the --listen port)")
	fs.StringVar(&cfg.FailureDomain, "failure-domain", cfg.FailureDomain, "what fails together with this node (rack, switch)")
	budget := fs.String("budget", "0", "shared-memory budget for all segments, e.g. 64GiB (0: the tmpfs size, at most half the host's memory)")
	jobBudget := fs.String("job-budget", "0", "the most of the budget one job's segments (its ranks' and its replicas) may take, e.g. 32GiB (0: no cap)")
	fs.IntVar(&cfg.SlotsPerRank, "slots", cfg.SlotsPerRank, "segments per rank (at least 2)")
	fs.BoolVar(&cfg.VerifyAfterCommit, "verify-after-commit", cfg.VerifyAfterCommit, "re-read every committed shard in the background")
	positiveDuration(fs, &cfg.PrepareTTL, "prepare-ttl", "how long a save's Prepare holds its segment without a Commit before a save short of budget takes it back")
	fs.IntVar(&cfg.TransferWorkers, "transfer-workers", cfg.TransferWorkers, "tier transfers running at once on the node")
	warmSize := fs.String("warm-segment", "0", "keep a segment of this size allocated and mapped for a restore onto this node (a spare), e.g. 8GiB; 0: none")
	var tf tierFlags
	tf.register(fs)
	var gf gossipFlags
	gf.register(fs, ":7946", "failure-detection members to join, host:port,... (default: the coordinator's host, port 7947)")
	var ff faultFlags
	ff.register(fs)
	var tlf tlsFlags
	tlf.register(fs)
	var ef agentEnrollFlags
	ef.register(fs)
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(strings.ToUpper(*logLevel))); err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	var err error
	if *jobKey != "" {
		if cfg.JobKeys, err = jobtoken.Load(*jobKey); err != nil {
			return err
		}
	}
	keep, err := ef.ensure(ctx, &tlf, cfg.Node, cfg.CoordinatorAddr, cfg.Logger)
	if err != nil {
		return err
	}
	if keep != nil {
		go keep(ctx)
	}
	if cfg.Transport, err = tlf.daemonSecurity(cfg.Logger, transport.RoleNode, cfg.Node); err != nil {
		return err
	}
	if cfg.Faults, err = ff.injector(cfg.Logger); err != nil {
		return err
	}
	tf.faults = cfg.Faults
	if cfg.Stores, cfg.TransferBandwidth, err = tf.stores(); err != nil {
		return err
	}
	if cfg.CoordinatorAddr != "" {
		if cfg.Gossip, err = gf.config(tlf.dir, cfg.Logger); err != nil {
			return err
		}
		cfg.GossipJoin = gf.seeds(cfg.CoordinatorAddr)
		if cfg.Gossip != nil {
			cfg.Gossip.Injector = cfg.Faults
		}
	}
	cfg.Registry = daemonRegistry(cfg.Gossip)
	w, err := units.ParseBytes(*warmSize)
	if err != nil {
		return fmt.Errorf("--warm-segment: %w", err)
	}
	cfg.WarmSegment = int64(w)
	b, err := units.ParseBytes(*budget)
	if err != nil {
		return err
	}
	cfg.BudgetBytes = b
	if cfg.JobBudgetBytes, err = units.ParseBytes(*jobBudget); err != nil {
		return fmt.Errorf("--job-budget: %w", err)
	}
	a, err := agent.New(cfg)
	if err != nil {
		return err
	}
	return a.Run(ctx, nil)
}
