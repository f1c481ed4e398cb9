package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/transport"
)

// coordCerts makes a CA, the coordinator's certificate and one that the
// simulated agents share, under dir.
func coordCerts(dir string) (coord, nodes *transport.Security, err error) {
	ca, err := transport.NewCA("rewind bench CA", time.Hour)
	if err != nil {
		return nil, nil, err
	}
	for _, id := range []transport.Identity{{Role: transport.RoleCoordinator, Name: "coordinator"}, {Role: transport.RoleNode, Name: transport.AnyNode}} {
		d := filepath.Join(dir, "certs", id.Role.String())
		if err := ca.IssueDir(d, transport.Leaf{Identity: id, Validity: time.Hour}); err != nil {
			return nil, nil, err
		}
		s, err := transport.Load(d, discardLog())
		if err != nil {
			return nil, nil, err
		}
		if id.Role == transport.RoleCoordinator {
			coord = s
		} else {
			nodes = s
		}
	}
	return coord, nodes, nil
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
}

// CoordResult is the figures for one job size.
type CoordResult struct {
	Ranks         int
	Agents        int
	Steps         int
	CommitsPerSec float64 // shard commits recorded per second, all agents together
	P50, P99, Max time.Duration
	Spread        time.Duration
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
	var nodeSec *transport.Security
	if cfg.TLS {
		if ccfg.Transport, nodeSec, err = coordCerts(dir); err != nil {
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
	addr := <-ready

	agents := (ranks + cfg.RanksPerNode - 1) / cfg.RanksPerNode
	// Each simulated agent reports on its own connection and long-lived
	// stream, as the agent's reporter does.
	clients := make([]coordpb.Coordinator_ReportStreamClient, agents)
	var api coordpb.CoordinatorClient
	for i := range clients {
		// Dialed as the agent's reporter dials (agent/reporter.go).
		conn, err := nodeSec.NewClient(addr, transport.ExpectCoordinator,
			grpc.WithStaticStreamWindowSize(1<<20), grpc.WithStaticConnWindowSize(1<<20))
		if err != nil {
			return CoordResult{}, err
		}
		defer conn.Close()
		api = coordpb.NewCoordinatorClient(conn)
		if clients[i], err = api.ReportStream(cctx); err != nil {
			return CoordResult{}, err
		}
	}
	job := fmt.Sprintf("bench-%d", ranks)
	if _, err := api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: job, WorldSize: uint32(ranks)}); err != nil {
		return CoordResult{}, err
	}
	var lat []float64
	start := time.Now()
	warmup := 2
	for step := range int64(cfg.Steps + warmup) {
		d, err := coordStep(ctx, clients, job, ranks, cfg.RanksPerNode, step, cfg.Spread)
		if err != nil {
			return CoordResult{}, err
		}
		if step == int64(warmup-1) {
			start = time.Now()
		}
		if step >= int64(warmup) {
			lat = append(lat, d.Seconds())
		}
	}
	elapsed := time.Since(start)
	res := CoordResult{Ranks: ranks, Agents: agents, Steps: cfg.Steps, Spread: cfg.Spread,
		CommitsPerSec: float64(ranks*cfg.Steps) / elapsed.Seconds()}
	res.P50, res.P99, res.Max = pct(lat, 0.50), pct(lat, 0.99), pct(lat, 1)
	return res, nil
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

// PrintCoordinator writes the results as a table.
func PrintCoordinator(w io.Writer, rs []CoordResult) {
	fmt.Fprintf(w, "%-7s %7s %6s %8s %14s %10s %10s %10s\n", "ranks", "agents", "steps", "spread", "commits/s", "p50", "p99", "max")
	for _, r := range rs {
		fmt.Fprintf(w, "%-7d %7d %6d %8s %14.0f %10s %10s %10s\n", r.Ranks, r.Agents, r.Steps, r.Spread, r.CommitsPerSec,
			r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond), r.Max.Round(10*time.Microsecond))
	}
}
