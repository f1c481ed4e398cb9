package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"

	"rewind.dev/rewind/internal/bench"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/shm"
)

func runBench(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "coordinator" {
		return benchCoordinator(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "coordinator-agents" {
		return benchCoordAgents(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "tiers" {
		return benchTiers(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "recovery" {
		return benchRecovery(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "goodput" {
		return benchGoodput(ctx, args[1:])
	}
	if len(args) > 0 && args[0] == "peer" {
		return benchPeer(ctx, args[1:])
	}
	if len(args) == 0 || args[0] != "save" {
		return fmt.Errorf("usage: rewind-dev bench save|coordinator|tiers|recovery|peer|goodput [flags]")
	}
	fs := flag.NewFlagSet("bench save", flag.ContinueOnError)
	sizes := fs.String("sizes", "1GiB,4GiB", "comma-separated state sizes per rank")
	runs := fs.Int("runs", 5, "measured runs per figure (the median is printed)")
	tensors := fs.Int("tensors", 64, "number of tensors the state is split into")
	workers := fs.Int("workers", 0, "copy/checksum goroutines (0: default)")
	shmDir := fs.String("shm-dir", "/dev/shm", "tmpfs to put the benchmark's segments in")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cfg := bench.SaveConfig{Runs: *runs, Tensors: *tensors, Workers: *workers, ShmDir: *shmDir, Out: os.Stdout}
	for _, s := range strings.Split(*sizes, ",") {
		b, err := units.ParseBytes(s)
		if err != nil {
			return err
		}
		cfg.Sizes = append(cfg.Sizes, b)
	}
	if cfg.Workers == 0 {
		cfg.Workers = shm.DefaultWorkers()
	}
	fmt.Printf("rewind-dev bench save: %d runs per figure (median), %d tensors, %d copy workers\n", cfg.Runs, cfg.Tensors, cfg.Workers)
	rs, err := bench.Save(ctx, cfg)
	bench.PrintSave(os.Stdout, rs, cfg.Workers)
	return err
}

func benchCoordinator(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench coordinator", flag.ContinueOnError)
	ranks := fs.String("ranks", "1024,8192", "comma-separated job sizes")
	perNode := fs.Int("ranks-per-node", 8, "ranks each simulated agent reports for")
	steps := fs.Int("steps", 30, "measured steps per job size")
	spread := fs.Duration("spread", 0, "window over which each step's reports are sent at random offsets (0: all at once, the worst case)")
	dir := fs.String("data-dir", os.TempDir(), "parent of the coordinator's temporary pebble store (a real disk: its syncs are measured)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the coordinator's process (with --agents-in-process, the simulated agents' too) to this file")
	memprofile := fs.String("memprofile", "", "write the coordinator process's allocations (go tool pprof -sample_index=alloc_space) to this file at the end")
	useTLS := fs.Bool("tls", false, "mutual TLS between the simulated agents and the coordinator, as in production")
	inProcess := fs.Bool("agents-in-process", false, "run the simulated agents in the coordinator's process (their garbage collections then stall it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	cfg := bench.CoordConfig{RanksPerNode: *perNode, Steps: *steps, DataDir: *dir, Spread: *spread, TLS: *useTLS}
	if !*inProcess {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		cfg.AgentsCommand = []string{self, "bench", "coordinator-agents"}
	}
	for _, s := range strings.Split(*ranks, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("bad job size %q", s)
		}
		cfg.Ranks = append(cfg.Ranks, n)
	}
	transportName := "plaintext"
	if cfg.TLS {
		transportName = "mutual TLS"
	}
	where := "in a process of their own"
	if *inProcess {
		where = "in the coordinator's process"
	}
	fmt.Printf("rewind-dev bench coordinator: simulated agents (%d ranks each, %s) report every step at once over loopback gRPC (%s) to a coordinator with a pebble store in %s\n", cfg.RanksPerNode, where, transportName, cfg.DataDir)
	fmt.Println("latency: from the sending of a step's last report (the last rank's commit) to the answer that the step is consistent (synced)")
	if *memprofile != "" {
		runtime.MemProfileRate = 64 << 10
	}
	rs, err := bench.Coordinator(ctx, cfg)
	bench.PrintCoordinator(os.Stdout, rs)
	if *memprofile != "" {
		if perr := writeHeapProfile(*memprofile); err == nil {
			err = perr
		}
	}
	return err
}

// writeHeapProfile writes the heap profile, allocations included, to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// benchCoordAgents is the simulated agents' process of bench coordinator.
func benchCoordAgents(ctx context.Context, args []string) error {
	return bench.CoordAgentsMain(ctx, args, os.Stdout)
}

func benchRecovery(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench recovery", flag.ContinueOnError)
	size := fs.String("size", "1GiB", "state per rank")
	runs := fs.Int("runs", 3, "runs, each on a fresh cluster (the medians are printed)")
	dir := fs.String("dir", os.TempDir(), "parent of the coordinator's temporary store and the agents' logs")
	shmDir := fs.String("shm-dir", "/dev/shm", "tmpfs to put the agents' shared memory in")
	rewind := fs.String("rewind", "", "the rewind binary the agents run (default: rewind beside this binary)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b, err := units.ParseBytes(*size)
	if err != nil {
		return err
	}
	bin := *rewind
	if bin == "" {
		if bin, err = rewindBeside(); err != nil {
			return err
		}
	}
	cfg := bench.RecoveryConfig{Binary: bin, Size: b, Runs: *runs, DataDir: *dir, ShmDir: *shmDir, Out: os.Stdout}
	fmt.Printf("rewind-dev bench recovery: a coordinator and 3 agent processes (rack-a, rack-b, rack-a) on loopback, failure detection on;\n"+
		"a job of 2 ranks saves %s per rank per step, replicated to 1 peer; a node running a rank is SIGKILLed and its shared memory removed;\n"+
		"its rank is restored onto the spare from the peer's memory. %d runs; shared memory needed: %s\n",
		units.Bytes(b), cfg.Runs, units.Bytes(bench.RecoveryShmNeeded(b)))
	res, err := bench.Recovery(ctx, cfg)
	bench.PrintRecovery(os.Stdout, res)
	return err
}

func benchPeer(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench peer", flag.ContinueOnError)
	size := fs.String("size", "1GiB", "the shard restored")
	runs := fs.Int("runs", 5, "runs, each measuring every figure once (the medians are printed)")
	shmDir := fs.String("shm-dir", "/dev/shm", "tmpfs to put the agents' shared memory in")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b, err := units.ParseBytes(*size)
	if err != nil {
		return err
	}
	cfg := bench.PeerConfig{Size: b, Runs: *runs, ShmDir: *shmDir, Out: os.Stdout}
	fmt.Printf("rewind-dev bench peer: a %s shard restored from a peer agent's memory (Fetch, the peer data path, every leaf hashed as it lands,\n"+
		"a new segment), between two agents in this process on loopback: plaintext, and mutual TLS 1.3 with each node's own certificate;\n"+
		"against bare loopback transfers of the same bytes into memory already faulted in, plaintext and TLS. %d runs, %d CPUs\n",
		units.Bytes(b), cfg.Runs, runtime.NumCPU())
	res, err := bench.Peer(ctx, cfg)
	bench.PrintPeer(os.Stdout, res)
	return err
}
