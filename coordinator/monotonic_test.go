package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/transport"
)

// The tests of this file hold DESIGN invariant 9: the latest consistent
// step an operator or SDK was told never goes back, across coordinator
// crashes and standby takeovers. Ranks save every 50 ms while the
// coordinator process is SIGKILLed; a history records every answer about
// the job's latest consistent step (Latest, ListJobs) with the process
// that gave it, and each answer of a successor must be at least every
// answer of the processes before it. At the end every rank restores the
// last answer's step, bit-identical.

// answers is the history of the answers about one job's latest
// consistent step, by coordinator process (gen counts the kills).
type answers struct {
	mu     sync.Mutex
	gen    int
	before int64 // the newest answer of the processes killed so far
	cur    int64 // the newest answer of the running one
	bad    []string
}

// generation is the process an answer asked now may come from.
func (h *answers) generation() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gen
}

// note records an answer asked of process gen: it must not be older than
// any answer before it, of this process (nothing in these tests moves a
// job back) or of its predecessors. An answer asked of one process and
// received once the next runs is left out: the killed one may have sent
// it.
func (h *answers) note(gen int, what string, step int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if gen != h.gen {
		return
	}
	if step < max(h.before, h.cur) && len(h.bad) < 20 {
		h.bad = append(h.bad, fmt.Sprintf("coordinator %d answered %s %d, after answers of %d (its own) and %d (its predecessors')", gen, what, step, h.cur, h.before))
	}
	h.cur = max(h.cur, step)
}

// killed starts the next process's history, once the last is reaped,
// and returns the newest answer so far.
func (h *answers) killed() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gen++
	h.before, h.cur = max(h.before, h.cur), -1
	return h.before
}

// newer reports whether the running process answered a step newer than
// every one before it.
func (h *answers) newer() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur <= h.before {
		return fmt.Errorf("coordinator %d answered at most %d, its predecessors %d", h.gen, h.cur, h.before)
	}
	return nil
}

// atLeast reports whether the running process answered step or newer.
func (h *answers) atLeast(step int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur < step {
		return fmt.Errorf("coordinator %d answered at most %d", h.gen, h.cur)
	}
	return nil
}

// observe asks the coordinator for job's latest consistent step, by
// Latest and ListJobs in turn, until ctx ends. A job the coordinator
// says it does not know has no step (-1); Unavailable is no answer.
func observe(ctx context.Context, api coordpb.CoordinatorClient, job string, h *answers) {
	for i := 0; ctx.Err() == nil; i++ {
		gen := h.generation()
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		if i%2 == 0 {
			resp, err := api.Latest(cctx, &coordpb.LatestRequest{Job: job})
			switch {
			case err == nil:
				h.note(gen, "Latest", resp.Step)
			case status.Code(err) == codes.NotFound:
				h.note(gen, "Latest (no such job)", -1)
			}
		} else if resp, err := api.ListJobs(cctx, &coordpb.ListJobsRequest{}); err == nil {
			latest := int64(-1)
			for _, j := range resp.Jobs {
				if j.Id == job {
					latest = j.LatestConsistent
				}
			}
			h.note(gen, "ListJobs", latest)
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// train saves a step of every rank every period, ranks in parallel as in
// synchronous training, until ctx ends; a failed save (the coordinator is
// down, so no slot can be freed) is tried again. It returns the last step
// every rank saved.
func train(ctx context.Context, sessions []*sdk.Session, period time.Duration) int64 {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for step := int64(0); ; step++ {
		var wg sync.WaitGroup
		for r, s := range sessions {
			wg.Go(func() {
				for ctx.Err() == nil {
					sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					err := s.Save(sctx, step, tinyState(r, step), nil)
					cancel()
					if err == nil {
						return
					}
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return step - 1
		}
		select {
		case <-ctx.Done():
			return step
		case <-tick.C:
		}
	}
}

// monoCluster is a coordinator process, three agents in the test's
// process (one fault injector), four ranks saving, and the history.
type monoCluster struct {
	t        *testing.T
	addr     string
	metrics  string
	standby  bool
	stores   [2]string
	proc     *testcluster.Proc
	api      coordpb.CoordinatorClient
	faults   *faultinject.Injector // the agents'
	sessions []*sdk.Session
	h        *answers
	cancel   context.CancelFunc
	bg       sync.WaitGroup
}

const monoJob = "mono"

// startMono starts the cluster, the training and the observer. With
// standby, each successor is a replica that took the lease with its own
// store: the two replicas' stores alternate, each as stale as the
// takeover before last left it (the first one empty).
func startMono(t *testing.T, standby bool) *monoCluster {
	const nodes, ranks = 3, 4
	dir := t.TempDir()
	m := &monoCluster{t: t, addr: testcluster.FreeAddr(t), metrics: testcluster.FreeAddr(t), standby: standby,
		stores: [2]string{filepath.Join(dir, "a"), filepath.Join(dir, "b")}, h: &answers{before: -1, cur: -1}}
	m.spawn()
	m.api = eagerClient(t, m.addr)
	waitUp(t, m.api)
	m.faults = injector(t, "")
	m.sessions = make([]*sdk.Session, ranks)
	for n := range nodes {
		cfg := testcluster.AgentConfig(t)
		cfg.Node, cfg.CoordinatorAddr, cfg.Faults = fmt.Sprintf("node-%d", n), m.addr, m.faults
		cfg.Logger = testcluster.Discard()
		startAgent(t, cfg)
		c := testcluster.Dial(t, cfg.Socket)
		for r := n; r < ranks; r += nodes {
			var err error
			if m.sessions[r], err = c.Session(monoJob, uint32(r), ranks); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	m.cancel = cancel
	t.Cleanup(cancel)
	m.bg.Go(func() { observe(ctx, m.api, monoJob, m.h) })
	m.bg.Go(func() { train(ctx, m.sessions, 50*time.Millisecond) })
	return m
}

// spawn starts the coordinator process of the current generation.
func (m *monoCluster) spawn() {
	store := m.stores[0]
	if m.standby {
		store = m.stores[m.h.generation()%2]
	}
	// An injector armed with nothing: faults are armed on /debug/faults.
	m.proc = testcluster.SpawnCoordinator(m.t, testcluster.CoordinatorProcess{Addr: m.addr, DataDir: store, Metrics: m.metrics,
		Standby: m.standby, LeaveGrace: 2 * time.Second}, faultinject.EnvSpec+"="+faultinject.CoordBeforeConsistent+"=off")
}

// kill SIGKILLs the coordinator and starts its successor; it returns the
// newest step answered before.
func (m *monoCluster) kill() int64 {
	m.proc.Kill()
	before := m.h.killed()
	m.spawn()
	return before
}

// waitNewer waits until the running coordinator answered a step newer
// than every one before it.
func (m *monoCluster) waitNewer() {
	m.t.Helper()
	wait.ForNil(m.t, 30*time.Second, "the coordinator to answer a newer step", m.h.newer)
}

// finish stops the training, checks the history, and restores the last
// answered step on every rank.
func (m *monoCluster) finish() {
	t := m.t
	t.Helper()
	m.waitNewer()
	m.cancel()
	m.bg.Wait()
	m.h.mu.Lock()
	for _, b := range m.h.bad {
		t.Error(b)
	}
	last := m.h.cur
	m.h.mu.Unlock()
	// The savers' last saves may have made a newer step consistent after
	// the poller's last answer (and reused the slots of the one it
	// named), and their reports may still be on the way once the savers
	// stopped, making one newer still: the latest must never be older,
	// and, once no newer step comes, whole on every rank.
	wait.ForNil(t, 10*time.Second, "the latest consistent step restorable on every rank", func() error {
		resp, err := m.api.Latest(ctxT(t), &coordpb.LatestRequest{Job: monoJob})
		if err != nil {
			return err
		}
		if resp.Step < last {
			t.Fatalf("latest consistent step after the last kill: %d, the last answered before was %d", resp.Step, last)
		}
		last = resp.Step
		for r, s := range m.sessions {
			got, err := s.RestoreStep(ctxT(t), last)
			if err != nil {
				return fmt.Errorf("rank %d restoring step %d, the latest consistent: %w", r, last, err)
			}
			if string(got.Tensors[0].Data) != string(tinyState(r, last)[0].Data) {
				t.Fatalf("rank %d restored step %d with other bytes than it saved", r, last)
			}
		}
		return nil
	})
	t.Logf("%d kills; the last coordinator answered step %d", m.h.generation(), last)
}

// armCoordinator arms spec on the coordinator process.
func (m *monoCluster) armCoordinator(spec string) {
	m.t.Helper()
	sec := testcluster.TLS(m.t, testcluster.OperatorID)
	req, _ := http.NewRequest(http.MethodPut, sec.URL(m.metrics, faultinject.HandlerPath), strings.NewReader(spec))
	resp, err := sec.HTTPClient(transport.ExpectCoordinator).Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		m.t.Fatalf("arming %s: %v %v", spec, resp, err)
	}
	resp.Body.Close()
}

// coordinatorHits returns how often point fired in the coordinator process.
func (m *monoCluster) coordinatorHits(point string) uint64 {
	sec := testcluster.TLS(m.t, testcluster.OperatorID)
	resp, err := sec.HTTPClient(transport.ExpectCoordinator).Get(sec.URL(m.metrics, faultinject.HandlerPath))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var st faultinject.State
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return 0
	}
	for _, p := range st.Points {
		if p.Name == point {
			return p.Hits
		}
	}
	return 0
}

func monoModes() map[string]bool {
	return map[string]bool{"restart on its store": false, "standby takes over": true}
}

// TestLatestNeverBackAcrossKills: 20 SIGKILLs of the coordinator at
// random moments while the ranks save every 50 ms; the successor restarts
// on its store, or is a standby with a store of its own.
func TestLatestNeverBackAcrossKills(t *testing.T) {
	s := seed(t)
	for name, standby := range monoModes() {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(s, 0))
			m := startMono(t, standby)
			for range 20 {
				// Once this process answered a step newer than its
				// predecessors', a random 0-300 ms on: the kill's moment
				// is the test's input, not a wait for an event.
				m.waitNewer()
				time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
				m.kill()
			}
			m.finish()
		})
	}
}

// TestLatestNeverBackKilledAtFaultPoints: the coordinator is SIGKILLed
// while held at each fault point of the commit path: on the agent, a
// shard copied but its commit not recorded, or recorded but not reported;
// on the coordinator, a step's consistency decided but not stored, or
// stored but not answered.
func TestLatestNeverBackKilledAtFaultPoints(t *testing.T) {
	points := map[string]bool{ // point -> on the coordinator
		faultinject.AgentShardCopied:      false,
		faultinject.AgentCommittedUnsent:  false,
		faultinject.CoordBeforeConsistent: true,
		faultinject.CoordConsistentStored: true,
	}
	for point, coord := range points {
		for name, standby := range monoModes() {
			t.Run(point+"/"+name, func(t *testing.T) {
				m := startMono(t, standby)
				wait.ForNil(t, 30*time.Second, "ten steps consistent", func() error { return m.h.atLeast(10) })
				for range 3 {
					m.waitNewer()
					// Held 1 s, within the successor's LeaveGrace (2 s):
					// an agent silent for longer is one the successor
					// may count as gone, and the answers of a node gone
					// may go back with it (the design's bound).
					spec := point + "=1*sleep(1s)"
					hits := func() uint64 { return m.faults.Hits()[point] }
					if coord {
						m.armCoordinator(spec)
						hits = func() uint64 { return m.coordinatorHits(point) }
					} else if err := m.faults.Set(spec); err != nil {
						t.Fatal(err)
					}
					wait.For(t, 10*time.Second, point+" to be reached", func() bool { return hits() > 0 })
					before := m.kill()
					t.Logf("killed at %s, the latest consistent step answered %d", point, before)
				}
				m.finish()
			})
		}
	}
}

// eagerClient is a client of the coordinator at addr that reconnects
// within 20 ms, as a fresh connection (an operator's command) would: it
// asks a restarted coordinator as soon as it listens. Each attempt may
// take 5 s to connect: without MinConnectTimeout gRPC gives an attempt
// only the backoff's delay, which a TLS handshake on a loaded machine
// outlasts every time, and the client never reconnects.
func eagerClient(t *testing.T, addr string) coordpb.CoordinatorClient {
	return testcluster.DialCoordinatorAs(t, addr, testcluster.OperatorID,
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.2, MaxDelay: 20 * time.Millisecond},
			MinConnectTimeout: 5 * time.Second}))
}
