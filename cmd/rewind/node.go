package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/internal/nodeproc"
	"rewind.dev/rewind/transport"
)

// runNode is `rewind node [node flags] -- [agent flags]`: one node of a
// cluster in one process (a container of deploy/compose): the agent,
// started exactly as `rewind agent` with the flags after --, and the
// supervisor of the job's ranks placed on this node (internal/nodeproc),
// each rank a `rewind-dev demo-train` process. It ends when either ends.
func runNode(ctx context.Context, args []string) error {
	nodeArgs, agentArgs := splitArgs(args)
	fs := newFlagSet("node", "node [flags] -- [rewind agent flags]", "the agent and the supervisor of the job's ranks on this node, in one process")
	job := fs.String("job", "chaos", "the job whose ranks this node runs")
	world := fs.Uint("world-size", 1, "the job's world size")
	ranks := fs.String("ranks", "", "ranks this node starts when the job is new, e.g. 0,1 (empty: a spare)")
	steps := fs.Int64("steps", 1_000_000, "the ranks train until this step")
	size := fs.String("size", "4MiB", "state per rank, saved every step")
	stepTime := fs.Duration("step-time", 0, "simulated compute per step (0: the trainer's default)")
	trainer := fs.String("trainer", "", "the rewind-dev binary whose demo-train command runs a rank (default: rewind-dev beside this binary)")
	if err := parseFlags(fs, nodeArgs); err != nil {
		return err
	}
	initial, err := parseRanks(*ranks)
	if err != nil {
		return fmt.Errorf("--ranks: %w", err)
	}
	coord := flagValue(agentArgs, "coordinator", "")
	if coord == "" {
		return errors.New("node: the agent flags after -- must name the --coordinator")
	}
	exe := *trainer
	if exe == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		exe = filepath.Join(filepath.Dir(self), "rewind-dev")
	}
	tlf := tlsFromArgs(agentArgs)
	sec, err := tlf.security(slog.Default())
	if err != nil {
		return err
	}
	conn, err := sec.NewClient(coord, transport.ExpectCoordinator, coordpb.KeepaliveDial(), coordpb.ReconnectDial())
	if err != nil {
		return fmt.Errorf("node: coordinator %s: %w", coord, err)
	}
	defer conn.Close()
	def := agent.DefaultConfig()
	cfg := nodeproc.DefaultConfig()
	cfg.Node, cfg.Job, cfg.WorldSize, cfg.InitialRanks = flagValue(agentArgs, "node", def.Node), *job, uint32(*world), initial
	cfg.Exe, cfg.Socket, cfg.API, cfg.Out = exe, flagValue(agentArgs, "socket", def.Socket), coordpb.NewCoordinatorClient(conn), os.Stdout
	if key := flagValue(agentArgs, "job-key", ""); key != "" {
		// The supervisor launches the job's ranks: it hands them the
		// job's token, minted with the agent's key.
		keys, err := jobtoken.Load(key)
		if err != nil {
			return err
		}
		cfg.JobToken = keys.Token(*job)
	}
	cfg.TrainArgs = []string{"--steps", strconv.FormatInt(*steps, 10), "--size", *size}
	if *stepTime > 0 {
		cfg.TrainArgs = append(cfg.TrainArgs, "--step-time", stepTime.String())
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "node")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	agentDone, supDone := make(chan error, 1), make(chan error, 1)
	go func() { agentDone <- runAgent(ctx, agentArgs) }()
	go func() { supDone <- nodeproc.Run(ctx, cfg) }()
	select {
	case err = <-agentDone:
		cancel()
		<-supDone
		if err == nil && ctx.Err() == nil {
			err = errors.New("node: the agent stopped")
		}
	case err = <-supDone:
		cancel()
		if aerr := <-agentDone; err == nil {
			err = aerr
		}
	}
	return err
}

// splitArgs splits the arguments at the first "--".
func splitArgs(args []string) (before, after []string) {
	for i, a := range args {
		if a == "--" {
			return args[:i], args[i+1:]
		}
	}
	return args, nil
}

// flagValue returns the value of flag name in args (-name v, --name v,
// -name=v or --name=v; the last one given), or def.
func flagValue(args []string, name, def string) string {
	v := def
	for i := 0; i < len(args); i++ {
		a := strings.TrimPrefix(strings.TrimPrefix(args[i], "-"), "-")
		if a == args[i] {
			continue // not a flag
		}
		if k, val, ok := strings.Cut(a, "="); ok && k == name {
			v = val
		} else if a == name && i+1 < len(args) {
			v = args[i+1]
			i++
		}
	}
	return v
}

// parseRanks parses "0,2" into ranks.
func parseRanks(s string) ([]uint32, error) {
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		r, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("rank %q: %w", f, err)
		}
		out = append(out, uint32(r))
	}
	return out, nil
}
