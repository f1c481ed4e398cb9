package coordinator_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// The test binary doubles as the coordinator and agent processes the
// tests kill (testcluster's roles).
func TestMain(m *testing.M) { testcluster.Main(m, nil) }

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
	proc      *testcluster.Proc
	crashes   int // exits of its own, at a fault point
}

const maxCrashes = 3

func spawnCoordinator(t *testing.T, addr, dataDir string, faultSeed uint64, env ...string) *coordProc {
	t.Helper()
	p := &coordProc{t: t, addr: addr, env: env, faultSeed: faultSeed}
	p.start(dataDir)
	return p
}

func (p *coordProc) start(dataDir string) {
	p.t.Helper()
	var env []string
	if p.crashes < maxCrashes && len(p.env) > 0 {
		env = append(slices.Clone(p.env), testcluster.FaultSeed(p.faultSeed+p.starts))
	}
	p.starts++
	p.proc = testcluster.SpawnCoordinator(p.t, testcluster.CoordinatorProcess{Addr: p.addr, DataDir: dataDir}, env...)
}

// kill SIGKILLs the process and waits for it.
func (p *coordProc) kill() { p.proc.Kill() }

// restartIfCrashed restarts the process on dataDir if it exited by itself
// (a fault point's exit), and reports whether it did.
func (p *coordProc) restartIfCrashed(dataDir string) bool {
	if !p.proc.Exited() {
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

// waitLatestAtLeast waits for job's latest consistent step to reach want
// and returns it; each poll calls each of also (a restart of a crashed
// coordinator). It fails the test if the step does not come.
func waitLatestAtLeast(t *testing.T, api coordpb.CoordinatorClient, job string, want int64, also ...func()) int64 {
	t.Helper()
	got := int64(-1)
	wait.ForNil(t, 15*time.Second, fmt.Sprintf("the latest consistent step of %s to reach %d", job, want), func() error {
		for _, f := range also {
			f()
		}
		if got = latestOf(t, api, job, -1); got < want {
			return fmt.Errorf("latest consistent step %d", got)
		}
		return nil
	})
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
		if st.State != coordpb.StepState_STEP_STATE_CONSISTENT {
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
	wait.ForNil(t, 15*time.Second, "the coordinator to answer", func() error {
		_, err := api.ListJobs(ctxT(t), &coordpb.ListJobsRequest{})
		return err
	})
}
