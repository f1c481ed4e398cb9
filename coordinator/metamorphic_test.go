package coordinator_test

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
)

// TestRandomizedCoordinatorKills: agents save steps of a job in a random
// (seeded) order, ranks at most one step apart as in synchronous training,
// while the coordinator process is SIGKILLed at random points and restarted
// on the same store or an empty one. After each restart the latest
// consistent step must come back at least as new as before the kill, and
// every step ever called consistent must have been committed by every rank
// and be restorable on every rank.
//
// It runs in metamorphic mode: random faults are armed too, drawn from the
// same seed — the coordinator exits at coordinator/before-consistent now
// and then (a crash in the middle of a commit), and saves fail before
// their commit or for a full /dev/shm. A failed save is retried, as a
// training loop would; the invariants above must hold all the same.
// REWIND_SEED replays a run: the schedule, the kills and every point's
// draws (the hits of one point come in the order the code reaches it).
func TestRandomizedCoordinatorKills(t *testing.T) {
	s := seed(t)
	rng := rand.New(rand.NewPCG(s, 0))
	const nodes, ranks, steps, kills = 3, 5, 24, 4
	addr := testcluster.FreeAddr(t)
	dataDir := filepath.Join(t.TempDir(), "store")
	coord := spawnCoordinator(t, addr, dataDir, rng.Uint64(), faultinject.EnvSpec+"=coordinator/before-consistent=4%exit(137)")
	api := testcluster.DialCoordinator(t, addr)
	waitUp(t, api)
	restart := func() { coord.restartIfCrashed(dataDir) }

	sessions, agentFaults := randomizedAgents(t, rng, addr, nodes, ranks)
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
		restart()
		saveRetrying(t, sessions[r], r, next[r], restart)
		committed[[2]int64{int64(r), next[r]}] = true
		next[r]++
		if killAt[i] {
			// Let the agents' reports land, then kill: what the
			// coordinator had said must not be lost.
			slowest := next[0]
			for _, n := range next {
				slowest = min(slowest, n)
			}
			waitLatestAtLeast(t, api, "rand", slowest-1, restart)
			before := latestOf(t, api, "rand", -1)
			coord.kill()
			dir := dataDir
			if rng.IntN(2) == 0 {
				dir = filepath.Join(t.TempDir(), fmt.Sprintf("empty-%d", i))
			}
			t.Logf("save #%d: killed the coordinator at latest consistent step %d; restarting on %s store", i, before, map[bool]string{true: "the same", false: "an empty"}[dir == dataDir])
			dataDir = dir
			coord.start(dir)
			if got := waitLatestAtLeast(t, api, "rand", before, restart); got < before {
				t.Fatalf("after the restart the latest consistent step is %d, older than %d before the kill", got, before)
			}
		}
		checkConsistent(t, api, committed, ranks)
	}
	final := waitLatestAtLeast(t, api, "rand", steps-1, restart)
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
	t.Logf("faults: coordinator crashed %d times at before-consistent; agents %v", coord.crashes, agentFaults.Hits())
}

// randomizedAgents starts the test's agents, in this process, sharing one
// injector armed with random save faults, and opens every rank's session.
func randomizedAgents(t *testing.T, rng *rand.Rand, addr string, nodes, ranks int) ([]*sdk.Session, *faultinject.Injector) {
	in := faultinject.New(slog.New(slog.NewTextHandler(io.Discard, nil)), rng.Uint64())
	if err := in.Set("agent/shard-copied=5%error(EIO);fs/shm/allocate=5%error(ENOSPC);agent/committed-unreported=5%sleep(20ms)"); err != nil {
		t.Fatal(err)
	}
	sessions := make([]*sdk.Session, ranks)
	for n := range nodes {
		cfg := testcluster.AgentConfig(t)
		cfg.Node, cfg.CoordinatorAddr, cfg.Faults = fmt.Sprintf("node-%d", n), addr, in
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		startAgent(t, cfg)
		c := testcluster.Dial(t, cfg.Socket)
		for r := n; r < ranks; r += nodes {
			var err error
			if sessions[r], err = c.Session("rand", uint32(r), uint32(ranks)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return sessions, in
}

// saveRetrying saves step of rank r, again after an injected fault (a
// training loop logs a failed save and saves again). While the coordinator
// is down (crashed at a fault point) the agent cannot learn that the step
// before is consistent, so it keeps that step's slot and a save one step
// on may find no free slot: that clear error is retried too, once the
// coordinator is restarted, until the agent has learnt it. Any other error
// fails the test.
func saveRetrying(t *testing.T, s *sdk.Session, r int, step int64, restart func()) {
	t.Helper()
	wait.ForNil(t, 30*time.Second, fmt.Sprintf("save %d of rank %d to succeed", step, r), func() error {
		err := s.Save(ctxT(t), step, tinyState(r, step), nil)
		if err == nil {
			return nil
		}
		// The SDK carries the agent's message, not its Go error.
		msg := err.Error()
		injected, noSlot := strings.Contains(msg, "injected fault at "), strings.Contains(msg, "slot not available")
		if !injected && !noSlot {
			t.Fatalf("save %d of rank %d: %v", step, r, err)
		}
		if noSlot {
			restart()
		}
		return err
	})
}
