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
	"strconv"
	"syscall"
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/faultinject"
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
	var err error
	if cfg.Faults, err = childFaults(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
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

// childFaults is the injector of a child process: armed from
// REWIND_FAULTS, seeded by REWIND_FAULT_SEED; nil when no spec is set.
func childFaults() (*faultinject.Injector, error) {
	if os.Getenv(faultinject.EnvSpec) == "" {
		return nil, nil
	}
	seed, _ := strconv.ParseUint(os.Getenv("REWIND_FAULT_SEED"), 10, 64)
	return faultinject.FromEnv(nil, seed)
}

// coordProc is a coordinator process of a test; env is added to its
// environment (a fault spec). It notices when the process exits by itself.
// Each start gets its own fault seed, derived from faultSeed, so a
// restarted coordinator does not crash again at the same hit; after
// maxCrashes exits of its own it runs without env.
type coordProc struct {
	t         *testing.T
	addr      string
	env       []string
	faultSeed uint64
	starts    uint64
	cmd       *exec.Cmd
	exited    chan struct{}
	crashes   int // exits of its own, at a fault point
}

const maxCrashes = 3

func spawnCoordinator(t *testing.T, addr, dataDir string, faultSeed uint64, env ...string) *coordProc {
	t.Helper()
	p := &coordProc{t: t, addr: addr, env: env, faultSeed: faultSeed}
	p.start(dataDir)
	t.Cleanup(p.kill)
	return p
}

func (p *coordProc) start(dataDir string) {
	p.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "REWIND_TEST_ROLE=coordinator", "REWIND_TEST_ADDR="+p.addr, "REWIND_TEST_DATA="+dataDir)
	if p.crashes < maxCrashes && len(p.env) > 0 {
		cmd.Env = append(cmd.Env, p.env...)
		cmd.Env = append(cmd.Env, "REWIND_FAULT_SEED="+strconv.FormatUint(p.faultSeed+p.starts, 10))
	}
	p.starts++
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
}

// kill SIGKILLs the process and waits for it.
func (p *coordProc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// restartIfCrashed restarts the process on dataDir if it exited by itself
// (a fault point's exit), and reports whether it did.
func (p *coordProc) restartIfCrashed(dataDir string) bool {
	select {
	case <-p.exited:
	default:
		return false
	}
	p.crashes++
	p.t.Logf("the coordinator exited at a fault point (crash %d); restarting it on its store", p.crashes)
	p.start(dataDir)
	return true
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

// waitLatestAtLeast waits for job's latest consistent step to reach want;
// each poll calls each of also (a restart of a crashed coordinator).
func waitLatestAtLeast(t *testing.T, api coordpb.CoordinatorClient, job string, want int64, also ...func()) int64 {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	got := int64(-1)
	for time.Now().Before(deadline) {
		for _, f := range also {
			f()
		}
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
