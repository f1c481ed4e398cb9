package bench

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/transport"
)

// coordCerts makes a CA, the coordinator's certificate and one that the
// simulated agents share, under dir; it returns the coordinator's
// security and the directory of the agents' certificate.
func coordCerts(dir string) (coord *transport.Security, nodeDir string, err error) {
	ca, err := transport.NewCA("rewind bench CA", time.Hour)
	if err != nil {
		return nil, "", err
	}
	for _, id := range []transport.Identity{{Role: transport.RoleCoordinator, Name: "coordinator"}, {Role: transport.RoleNode, Name: transport.AnyNode}} {
		d := filepath.Join(dir, "certs", id.Role.String())
		if err := ca.IssueDir(d, transport.Leaf{Identity: id, Validity: time.Hour}); err != nil {
			return nil, "", err
		}
		if id.Role == transport.RoleNode {
			nodeDir = d
			continue
		}
		if coord, err = transport.Load(d, discardLog()); err != nil {
			return nil, "", err
		}
	}
	return coord, nodeDir, nil
}

// CoordConfig configures the coordinator benchmark.
type CoordConfig struct {
	Ranks        []int // job sizes to measure
	RanksPerNode int   // ranks each simulated agent reports for (GPUs per node)
	Steps        int   // measured steps per job size
	DataDir      string
	// Spread is the window over which the agents' reports of a step are
	// sent, each at a random offset, as ranks finish their saves at
	// slightly different times; 0 sends them all at once (the worst case).
	Spread time.Duration
	// TLS runs the coordinator and every simulated agent with mutual TLS
	// (a shared node certificate: each report is still checked against
	// the rules).
	TLS bool
	// AgentsCommand, when set, runs the simulated agents in a process of
	// their own: this command, with CoordAgentsFlags' flags appended (see
	// ServeCoordAgents). A coordinator runs alone in its process; agents
	// in the same one would charge it for their garbage collections.
	// Empty: the agents run in this process.
	AgentsCommand []string
}

// CoordResult is the figures for one job size.
type CoordResult struct {
	Ranks         int
	Agents        int
	Steps         int
	CommitsPerSec float64 // shard commits recorded per second, all agents together
	P50, P99, Max time.Duration
	Spread        time.Duration
	// The coordinator process's garbage collection: bytes it allocated
	// per step, and the steps during which a collection of it ended
	// (GCSteps) against the others (their p50 and p99).
	AllocPerStep       float64
	GCSteps            int
	GCStepP50          time.Duration
	QuietP50, QuietP99 time.Duration
}

// Coordinator measures global commit: simulated agents (one gRPC client
// each, over loopback, against a real coordinator with a real pebble store)
// report their ranks' commits of every step at once, as the agents of a
// synchronous job do, plus the deletion of the step their slot held two
// saves ago. Latency is from the start of the report that completes a step
// to its answer saying the step is consistent (its sync included).
func Coordinator(ctx context.Context, cfg CoordConfig) ([]CoordResult, error) {
	var out []CoordResult
	for _, n := range cfg.Ranks {
		r, err := coordOne(ctx, cfg, n)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func coordOne(ctx context.Context, cfg CoordConfig, ranks int) (CoordResult, error) {
	dir, err := os.MkdirTemp(cfg.DataDir, "rewind-bench-coord-")
	if err != nil {
		return CoordResult{}, err
	}
	defer os.RemoveAll(dir)
	ccfg := coordinator.DefaultConfig()
	ccfg.ListenAddr, ccfg.MetricsAddr, ccfg.DataDir = "127.0.0.1:0", "", dir
	ccfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	acfg := CoordAgentsConfig{Ranks: ranks, RanksPerNode: cfg.RanksPerNode, Steps: cfg.Steps, Spread: cfg.Spread}
	if cfg.TLS {
		if ccfg.Transport, acfg.Certs, err = coordCerts(dir); err != nil {
			return CoordResult{}, err
		}
	}
	c, err := coordinator.New(ccfg)
	if err != nil {
		return CoordResult{}, err
	}
	defer c.Close()
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	ready := make(chan string, 1)
	go c.Run(cctx, func(a, _ string) { ready <- a })
	acfg.Addr = <-ready

	var steps []stepTime
	var elapsed time.Duration
	alloc := newGCWatch()
	if len(cfg.AgentsCommand) == 0 {
		steps, elapsed, err = coordAgents(cctx, acfg, nil)
	} else {
		steps, elapsed, err = runCoordAgents(cctx, cfg.AgentsCommand, acfg)
	}
	if err != nil {
		return CoordResult{}, err
	}
	res := CoordResult{Ranks: ranks, Agents: (ranks + cfg.RanksPerNode - 1) / cfg.RanksPerNode, Steps: cfg.Steps, Spread: cfg.Spread,
		CommitsPerSec: float64(ranks*cfg.Steps) / elapsed.Seconds(), AllocPerStep: alloc.allocated() / float64(len(steps))}
	var all, gc, quiet []float64
	for _, st := range steps {
		all = append(all, st.lat.Seconds())
		if st.gc {
			gc = append(gc, st.lat.Seconds())
		} else {
			quiet = append(quiet, st.lat.Seconds())
		}
	}
	res.P50, res.P99, res.Max = pct(all, 0.50), pct(all, 0.99), pct(all, 1)
	res.GCSteps = len(gc)
	if len(gc) > 0 {
		res.GCStepP50 = pct(gc, 0.5)
	}
	if len(quiet) > 0 {
		res.QuietP50, res.QuietP99 = pct(quiet, 0.5), pct(quiet, 0.99)
	}
	return res, nil
}

// CoordAgentsConfig configures the simulated agents of the coordinator
// benchmark.
type CoordAgentsConfig struct {
	Addr         string // the coordinator's
	Ranks        int
	RanksPerNode int
	Steps        int // measured; two more warm up first
	Spread       time.Duration
	Certs        string // the agents' certificate directory; empty: plaintext
}

// Flags returns cfg as the flags ServeCoordAgents' command parses.
func (cfg CoordAgentsConfig) Flags() []string {
	return []string{"--addr", cfg.Addr, "--ranks", strconv.Itoa(cfg.Ranks), "--ranks-per-node", strconv.Itoa(cfg.RanksPerNode),
		"--steps", strconv.Itoa(cfg.Steps), "--spread", cfg.Spread.String(), "--certs", cfg.Certs}
}

// stepTime is one measured step: its latency, and whether a collection
// of the coordinator's process ended while it ran.
type stepTime struct {
	lat time.Duration
	gc  bool
}

// ServeCoordAgents runs the simulated agents against the coordinator at
// cfg.Addr and writes each measured step to w as it goes, one line each:
// "begin STEP" when its reports start, "end STEP LATENCY_NS" when it is
// consistent, then "done ELAPSED_NS". The coordinator's process reads them
// (runCoordAgents) and tells which steps its collections fell in.
func ServeCoordAgents(ctx context.Context, cfg CoordAgentsConfig, w io.Writer) error {
	var werr error
	line := func(format string, args ...any) {
		if _, err := fmt.Fprintf(w, format+"\n", args...); err != nil && werr == nil {
			werr = err
		}
	}
	_, elapsed, err := coordAgents(ctx, cfg, func(step int64, end bool, lat time.Duration) {
		if end {
			line("end %d %d", step, lat.Nanoseconds())
		} else {
			line("begin %d", step)
		}
	})
	if err != nil {
		return err
	}
	line("done %d", elapsed.Nanoseconds())
	return werr
}

// CoordAgentsMain parses the flags of CoordAgentsConfig.Flags and runs
// ServeCoordAgents: the body of the agents' process.
func CoordAgentsMain(ctx context.Context, args []string, w io.Writer) error {
	fs := flag.NewFlagSet("bench coordinator-agents", flag.ContinueOnError)
	var cfg CoordAgentsConfig
	fs.StringVar(&cfg.Addr, "addr", "", "the coordinator's address")
	fs.IntVar(&cfg.Ranks, "ranks", 0, "job size")
	fs.IntVar(&cfg.RanksPerNode, "ranks-per-node", 8, "ranks each simulated agent reports for")
	fs.IntVar(&cfg.Steps, "steps", 30, "measured steps")
	fs.DurationVar(&cfg.Spread, "spread", 0, "window over which each step's reports are sent")
	fs.StringVar(&cfg.Certs, "certs", "", "the agents' certificate directory (empty: plaintext)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.Addr == "" || cfg.Ranks < 1 || cfg.RanksPerNode < 1 || cfg.Steps < 1 {
		return fmt.Errorf("bench coordinator-agents: --addr, --ranks, --ranks-per-node and --steps are required")
	}
	return ServeCoordAgents(ctx, cfg, w)
}

// runCoordAgents runs the simulated agents in their own process and
// collects their steps, noting the coordinator's collections.
func runCoordAgents(ctx context.Context, command []string, cfg CoordAgentsConfig) ([]stepTime, time.Duration, error) {
	cmd := exec.CommandContext(ctx, command[0], append(slices.Clone(command[1:]), cfg.Flags()...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, 0, err
	}
	if err := cmd.Start(); err != nil {
		return nil, 0, fmt.Errorf("bench: starting the simulated agents: %w", err)
	}
	var steps []stepTime
	var elapsed time.Duration
	var at uint64
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var n int64
		switch f := strings.Fields(sc.Text()); {
		case len(f) == 2 && f[0] == "begin":
			at = gcCycles()
		case len(f) == 3 && f[0] == "end":
			if n, err = strconv.ParseInt(f[2], 10, 64); err == nil {
				steps = append(steps, stepTime{lat: time.Duration(n), gc: gcCycles() != at})
			}
		case len(f) == 2 && f[0] == "done":
			n, err = strconv.ParseInt(f[1], 10, 64)
			elapsed = time.Duration(n)
		default:
			err = fmt.Errorf("bench: unexpected line from the simulated agents: %q", sc.Text())
		}
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, 0, err
		}
	}
	if err := cmd.Wait(); err != nil {
		return nil, 0, fmt.Errorf("bench: simulated agents: %w", err)
	}
	if elapsed == 0 || len(steps) != cfg.Steps {
		return nil, 0, fmt.Errorf("bench: the simulated agents reported %d of %d steps", len(steps), cfg.Steps)
	}
	return steps, elapsed, nil
}

// coordAgents dials one connection and report stream per simulated agent,
// registers the job and runs its steps; mark, when set, hears each
// measured step begin and end. Run in the coordinator's process (mark
// nil), a step notes that process's collections itself.
func coordAgents(ctx context.Context, cfg CoordAgentsConfig, mark func(step int64, end bool, lat time.Duration)) ([]stepTime, time.Duration, error) {
	var sec *transport.Security
	if cfg.Certs != "" {
		var err error
		if sec, err = transport.Load(cfg.Certs, discardLog()); err != nil {
			return nil, 0, err
		}
	}
	agents := (cfg.Ranks + cfg.RanksPerNode - 1) / cfg.RanksPerNode
	// Each simulated agent reports on its own connection and long-lived
	// stream, as the agent's reporter does.
	clients := make([]coordpb.Coordinator_ReportStreamClient, agents)
	var api coordpb.CoordinatorClient
	for i := range clients {
		// Dialed as the agent's reporter dials (agent/reporter.go).
		conn, err := sec.NewClient(cfg.Addr, transport.ExpectCoordinator,
			grpc.WithStaticStreamWindowSize(1<<20), grpc.WithStaticConnWindowSize(1<<20))
		if err != nil {
			return nil, 0, err
		}
		defer conn.Close()
		api = coordpb.NewCoordinatorClient(conn)
		if clients[i], err = api.ReportStream(ctx); err != nil {
			return nil, 0, err
		}
	}
	job := fmt.Sprintf("bench-%d", cfg.Ranks)
	if _, err := api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: job, WorldSize: uint32(cfg.Ranks)}); err != nil {
		return nil, 0, err
	}
	var steps []stepTime
	start := time.Now()
	const warmup = 2
	for step := range int64(cfg.Steps + warmup) {
		measured := step >= warmup
		at := gcCycles()
		if measured && mark != nil {
			mark(step, false, 0)
		}
		d, err := coordStep(ctx, clients, job, cfg.Ranks, cfg.RanksPerNode, step, cfg.Spread)
		if err != nil {
			return nil, 0, err
		}
		if step == warmup-1 {
			start = time.Now()
		}
		if measured {
			steps = append(steps, stepTime{lat: d, gc: gcCycles() != at})
			if mark != nil {
				mark(step, true, d)
			}
		}
	}
	return steps, time.Since(start), nil
}

// gcCycles returns how many collections this process has finished.
func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// gcWatch measures what this process allocates from its creation on.
type gcWatch struct{ start uint64 }

func newGCWatch() gcWatch { return gcWatch{start: heapAllocs()} }

func (w gcWatch) allocated() float64 { return float64(heapAllocs() - w.start) }

func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// coordStep has every agent report its ranks' commit of step, within the
// spread window, and returns the time from the last report's sending (the
// last rank's commit) to the answer that the step is consistent.
func coordStep(ctx context.Context, clients []coordpb.Coordinator_ReportStreamClient, job string, ranks, perNode int, step int64, spread time.Duration) (time.Duration, error) {
	var mu sync.Mutex
	var lastSend, done time.Time
	var errs []error
	var wg sync.WaitGroup
	start := time.Now()
	for a, cl := range clients {
		wg.Go(func() {
			node := fmt.Sprintf("node-%04d", a)
			var recs []*coordpb.ShardRecord
			for r := a * perNode; r < min(ranks, (a+1)*perNode); r++ {
				recs = append(recs, &coordpb.ShardRecord{Job: job, Step: step, Rank: uint32(r), WorldSize: uint32(ranks), Node: node, SizeBytes: 1 << 30, HeaderChecksum: "0123456789abcdef", State: coordpb.CopyState_COPY_STATE_COMMITTED})
				if step >= 2 {
					recs = append(recs, &coordpb.ShardRecord{Job: job, Step: step - 2, Rank: uint32(r), WorldSize: uint32(ranks), Node: node, State: coordpb.CopyState_COPY_STATE_DELETED})
				}
			}
			if spread > 0 {
				time.Sleep(time.Until(start.Add(time.Duration(rand.Int64N(int64(spread))))))
			}
			t0 := time.Now()
			err := cl.Send(&coordpb.ReportRequest{Node: node, Shards: recs})
			var resp *coordpb.ReportResponse
			if err == nil {
				resp, err = cl.Recv()
			}
			if err == nil && resp.ErrorCode != 0 {
				err = fmt.Errorf("bench: report refused: %s", resp.Error)
			}
			t1 := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if t0.After(lastSend) {
				lastSend = t0
			}
			if err != nil {
				errs = append(errs, err)
				return
			}
			for _, p := range resp.Consistent {
				if p.Step == step {
					done = t1
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return 0, errs[0]
	}
	if done.IsZero() {
		return 0, fmt.Errorf("bench: step %d of %s never became consistent", step, job)
	}
	return done.Sub(lastSend), nil
}

func pct(v []float64, p float64) time.Duration {
	s := sortedCopy(v)
	i := min(len(s)-1, int(p*float64(len(s))))
	return time.Duration(s[i] * float64(time.Second))
}

// PrintCoordinator writes the results as a table, then the coordinator
// process's collections: bytes allocated per step, and the latency of the
// steps a collection ended in against the others'.
func PrintCoordinator(w io.Writer, rs []CoordResult) {
	fmt.Fprintf(w, "%-7s %7s %6s %8s %14s %10s %10s %10s\n", "ranks", "agents", "steps", "spread", "commits/s", "p50", "p99", "max")
	for _, r := range rs {
		fmt.Fprintf(w, "%-7d %7d %6d %8s %14.0f %10s %10s %10s\n", r.Ranks, r.Agents, r.Steps, r.Spread, r.CommitsPerSec,
			r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond), r.Max.Round(10*time.Microsecond))
	}
	fmt.Fprintf(w, "\n%-7s %14s %12s %14s %14s %14s\n", "ranks", "alloc/step", "steps w/ GC", "GC steps p50", "others p50", "others p99")
	for _, r := range rs {
		fmt.Fprintf(w, "%-7d %11.1f MB %12d %14s %14s %14s\n", r.Ranks, r.AllocPerStep/1e6, r.GCSteps,
			r.GCStepP50.Round(10*time.Microsecond), r.QuietP50.Round(10*time.Microsecond), r.QuietP99.Round(10*time.Microsecond))
	}
}
