package coordinator_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/agenttest"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// The test binary doubles as the coordinator process the randomized test
// kills.
func TestMain(m *testing.M) {
	switch os.Getenv("REWIND_TEST_ROLE") {
	case "coordinator":
		os.Exit(childCoordinator())
	case "agent":
		os.Exit(childAgent())
	}
	os.Exit(m.Run())
}

func childCoordinator() int {
	cfg := coordinator.DefaultConfig()
	cfg.ListenAddr, cfg.MetricsAddr, cfg.DataDir = os.Getenv("REWIND_TEST_ADDR"), "", os.Getenv("REWIND_TEST_DATA")
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := coordinator.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func spawnCoordinator(t *testing.T, addr, dataDir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "REWIND_TEST_ROLE=coordinator", "REWIND_TEST_ADDR="+addr, "REWIND_TEST_DATA="+dataDir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func seed(t *testing.T) uint64 {
	s := uint64(time.Now().UnixNano())
	if v := os.Getenv("REWIND_SEED"); v != "" {
		var err error
		if s, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (replay with REWIND_SEED=%d)", s, s)
	return s
}

// TestRandomizedCoordinatorKills: agents save steps of a job in a random
// (seeded) order, ranks at most one step apart as in synchronous training,
// while the coordinator process is SIGKILLed at random points and restarted
// on the same store or an empty one. After each restart the latest
// consistent step must come back at least as new as before the kill, and
// every step ever called consistent must have been committed by every rank
// and be restorable on every rank.
func TestRandomizedCoordinatorKills(t *testing.T) {
	rng := rand.New(rand.NewPCG(seed(t), 0))
	const nodes, ranks, steps, kills = 3, 5, 24, 4
	addr := agenttest.FreePort(t)
	dataDir := filepath.Join(t.TempDir(), "store")
	coord := spawnCoordinator(t, addr, dataDir)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := coordpb.NewCoordinatorClient(conn)
	waitUp(t, api)

	sessions := make([]*sdk.Session, ranks)
	for n := range nodes {
		cfg := agenttest.Config(t)
		cfg.Node, cfg.CoordinatorAddr = fmt.Sprintf("node-%d", n), addr
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		startAgent(t, cfg)
		c, err := sdk.Dial(context.Background(), cfg.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for r := n; r < ranks; r += nodes {
			if sessions[r], err = c.Session("rand", uint32(r), ranks); err != nil {
				t.Fatal(err)
			}
		}
	}
	next := make([]int64, ranks) // next step each rank saves
	committed := map[[2]int64]bool{}
	killAt := map[int]bool{}
	for len(killAt) < kills {
		killAt[1+rng.IntN(ranks*steps-2)] = true
	}
	for i := 0; ; i++ {
		r, ok := pickRank(rng, next, steps)
		if !ok {
			break
		}
		if err := sessions[r].Save(ctxT(t), next[r], tinyState(r, next[r]), nil); err != nil {
			t.Fatalf("save %d of rank %d: %v", next[r], r, err)
		}
		committed[[2]int64{int64(r), next[r]}] = true
		next[r]++
		if killAt[i] {
			// Let the agents' reports land, then kill: what the
			// coordinator had said must not be lost.
			slowest := next[0]
			for _, n := range next {
				slowest = min(slowest, n)
			}
			waitLatestAtLeast(t, api, "rand", slowest-1)
			before := latestOf(t, api, "rand", -1)
			coord.Process.Signal(syscall.SIGKILL)
			coord.Wait()
			dir := dataDir
			if rng.IntN(2) == 0 {
				dir = filepath.Join(t.TempDir(), fmt.Sprintf("empty-%d", i))
			}
			t.Logf("save #%d: killed the coordinator at latest consistent step %d; restarting on %s store", i, before, map[bool]string{true: "the same", false: "an empty"}[dir == dataDir])
			coord = spawnCoordinator(t, addr, dir)
			if got := waitLatestAtLeast(t, api, "rand", before); got < before {
				t.Fatalf("after the restart the latest consistent step is %d, older than %d before the kill", got, before)
			}
		}
		checkConsistent(t, api, committed, ranks)
	}
	final := waitLatestAtLeast(t, api, "rand", steps-1)
	if final != steps-1 {
		t.Fatalf("final latest consistent step %d, want %d", final, steps-1)
	}
	for r, s := range sessions {
		got, err := s.RestoreStep(ctxT(t), final)
		if err != nil {
			t.Fatalf("rank %d cannot restore the latest consistent step %d: %v", r, final, err)
		}
		if string(got.Tensors[0].Data) != string(tinyState(r, final)[0].Data) {
			t.Fatalf("rank %d step %d restored the wrong bytes", r, final)
		}
	}
}

// pickRank picks a rank that may save next: ranks run at most one step
// ahead of the slowest, as in synchronous data-parallel training.
func pickRank(rng *rand.Rand, next []int64, steps int64) (int, bool) {
	slowest := next[0]
	for _, n := range next {
		slowest = min(slowest, n)
	}
	var can []int
	for r, n := range next {
		if n < steps && n <= slowest {
			can = append(can, r)
		}
	}
	if len(can) == 0 {
		return 0, false
	}
	return can[rng.IntN(len(can))], true
}

func tinyState(rank int, step int64) []sdk.Tensor {
	b := []byte(fmt.Sprintf("rank %d step %d", rank, step))
	return []sdk.Tensor{{Name: "s", DType: shm.U8, Shape: []int64{int64(len(b))}, Data: b}}
}

func latestOf(t *testing.T, api coordpb.CoordinatorClient, job string, def int64) int64 {
	resp, err := api.Latest(ctxT(t), &coordpb.LatestRequest{Job: job})
	if err != nil {
		return def
	}
	return resp.Step
}

func waitLatestAtLeast(t *testing.T, api coordpb.CoordinatorClient, job string, want int64) int64 {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	got := int64(-1)
	for time.Now().Before(deadline) {
		if got = latestOf(t, api, job, -1); got >= want {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
	return got
}

// checkConsistent fails t if the coordinator calls a step consistent that
// some rank never committed.
func checkConsistent(t *testing.T, api coordpb.CoordinatorClient, committed map[[2]int64]bool, ranks int) {
	t.Helper()
	resp, err := api.ListSteps(ctxT(t), &coordpb.ListStepsRequest{Job: "rand"})
	if err != nil {
		return // the coordinator is restarting or has not heard of the job yet
	}
	for _, st := range resp.Steps {
		if st.State != "consistent" {
			continue
		}
		for r := range ranks {
			if !committed[[2]int64{int64(r), st.Step}] {
				t.Fatalf("step %d is consistent but rank %d never committed it", st.Step, r)
			}
		}
	}
}

func waitUp(t *testing.T, api coordpb.CoordinatorClient) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := api.ListJobs(ctxT(t), &coordpb.ListJobsRequest{}); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("coordinator did not come up within 15s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
