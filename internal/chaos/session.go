package chaos

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/regang"
)

// session is one scenario's run against a fresh cluster: the faults it
// injects, what it observes, and the measurements for its row.
type session struct {
	cfg  *Config
	c    *Cluster
	rng  *rand.Rand
	name string
	t0   time.Time

	mu        sync.Mutex
	ev        Evidence
	detected  []time.Duration // scenario-specific: fault to detection
	recovered []time.Duration // scenario-specific: healing to recovery
	extra     []Check
	verified  uint64 // bytes of copies re-read by VerifyStep
	// staleNode is a node the job was recovered without and that came
	// back (thawed, reconnected): its old ranks must commit nothing.
	staleNode string
	extraSeen int // recoveries beyond the lost nodes already noted
	// hist is what the clients saw, for the history checker.
	hist History
	// stacks are the daemons' goroutines, taken when a recovery was
	// late (kept with the logs of a failed scenario).
	stacks map[string][]byte
}

// stuckAfter is how long after its wait began a recovery counts as late:
// the daemons' goroutines are taken then, while it is still stuck.
const stuckAfter = 20 * time.Second

// takeStacks keeps every running daemon's goroutines, once a scenario.
func (s *session) takeStacks(ctx context.Context, why string) {
	if s.stacks != nil {
		return
	}
	s.stacks = map[string][]byte{}
	for _, svc := range append([]string{svcCoordinator}, nodeServices...) {
		if b, err := s.c.Goroutines(ctx, svc); err == nil {
			s.stacks[svc] = b
		}
	}
	s.logf("%s: the goroutines of %d daemons taken, kept with the logs", why, len(s.stacks))
}

func (s *session) logf(format string, args ...any) {
	fmt.Fprintf(s.cfg.Out, "  %6.1fs %s: %s\n", time.Since(s.t0).Seconds(), s.name, fmt.Sprintf(format, args...))
}

// snapshot asks the coordinator for the job's steps and the nodes' tiers.
func (s *session) snapshot(ctx context.Context) (*Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	snap := &Snapshot{At: time.Now()}
	jobs, err := s.c.API.ListJobs(ctx, &coordpb.ListJobsRequest{Job: s.cfg.Job}) // its placement
	if err != nil {
		return nil, err
	}
	for _, j := range jobs.Jobs {
		if j.Id == s.cfg.Job {
			snap.Job = j
		}
	}
	if snap.Job != nil {
		steps, err := s.c.API.ListSteps(ctx, &coordpb.ListStepsRequest{Job: s.cfg.Job})
		if err != nil {
			return nil, err
		}
		snap.Steps = steps.Steps
	}
	ts, err := s.c.API.TierStatus(ctx, &coordpb.TierStatusRequest{})
	if err != nil {
		return nil, err
	}
	snap.Nodes = ts.Nodes
	return snap, nil
}

// watch polls the coordinator and follows the job's recovery events
// until ctx ends.
func (s *session) watch(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = regang.Follow(ctx, s.c.API, s.cfg.Job, nopDriver{}, func(ev *coordpb.JobEvent) {
			s.logf("recovery event: %s, step %d, ok %v: %s%s", ev.Kind.Label(), ev.Step, ev.Ok, ev.Reason, ev.Error)
			s.mu.Lock()
			defer s.mu.Unlock()
			if ev.Ok && ev.Kind == coordpb.JobEventKind_JOB_EVENT_KIND_REGANG {
				s.ev.Recoveries = append(s.ev.Recoveries, ev)
				s.hist.Add(s.recoveryOp(ev))
			} else {
				s.ev.Failed = append(s.ev.Failed, ev)
			}
		})
	})
	wg.Go(func() {
		for clock.Sleep(ctx, 250*time.Millisecond) == nil {
			if snap, err := s.snapshot(ctx); err == nil {
				s.hist.Add(listingOp(s.cfg.Job, snap))
				s.mu.Lock()
				s.ev.Snapshots = append(s.ev.Snapshots, snap)
				s.mu.Unlock()
			}
		}
	})
	wg.Go(func() { s.pollLatest(ctx) })
	wg.Wait()
}

type nopDriver struct{}

func (nopDriver) Regang(context.Context, *coordpb.JobEvent) error { return nil }

// waitSnap polls the coordinator until cond holds, for at most timeout.
func (s *session) waitSnap(ctx context.Context, what string, timeout time.Duration, cond func(*Snapshot) bool) (*Snapshot, error) {
	deadline := time.Now().Add(timeout)
	var err error
	for {
		var snap *Snapshot
		if snap, err = s.snapshot(ctx); err == nil && cond(snap) {
			return snap, nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return nil, fmt.Errorf("chaos: waited %v for %s (coordinator: %v)", timeout, what, err)
			}
			return nil, fmt.Errorf("chaos: waited %v for %s (latest consistent step %d)", timeout, what, snap.LatestConsistent())
		}
		if clock.Sleep(ctx, 100*time.Millisecond) != nil {
			return nil, ctx.Err()
		}
	}
}

// warmUp waits until the job has trained a random number of steps more
// (4 to 10: the fault lands at a random step) and has a durable copy on
// NVMe and on the object store.
func (s *session) warmUp(ctx context.Context) error {
	now, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	w := max(now.LatestConsistent(), 0) + int64(4+s.rng.IntN(7))
	_, err = s.waitSnap(ctx, fmt.Sprintf("step %d consistent with copies durable on nvme and s3", w), 2*time.Minute, func(sn *Snapshot) bool {
		return sn.LatestConsistent() >= w && len(sn.Durable("s3")) > 0 && len(sn.Durable("nvme")) > 0
	})
	if err == nil {
		s.logf("warm: step %d consistent, durable on nvme and s3", w)
	}
	return err
}

// inject takes the coordinator's view, then runs the fault, and records
// it; it returns the fault's index.
func (s *session) inject(ctx context.Context, what, node string, lost bool, do func(context.Context) error) (int, error) {
	before, err := s.snapshot(ctx)
	if err != nil {
		return 0, fmt.Errorf("chaos: the coordinator's view before %s: %w", what, err)
	}
	at := time.Now()
	if err := do(ctx); err != nil {
		return 0, fmt.Errorf("chaos: %s: %w", what, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ev.Faults = append(s.ev.Faults, Fault{What: what, At: at, Node: node, Lost: lost, Before: before})
	s.logf("fault: %s (latest consistent step %d)", what, before.LatestConsistent())
	return len(s.ev.Faults) - 1, nil
}

// whileFrozen runs do with the coordinator frozen (docker pause) and
// thaws it after, whatever do returned: a fault made of several steps
// that no recovery may start between.
func (s *session) whileFrozen(ctx context.Context, do func() error) error {
	if err := s.c.Pause(ctx, svcCoordinator); err != nil {
		return fmt.Errorf("freezing the coordinator: %w", err)
	}
	err := do()
	if uerr := s.c.Unpause(context.WithoutCancel(ctx), svcCoordinator); uerr != nil && err == nil {
		err = fmt.Errorf("thawing the coordinator: %w", uerr)
	}
	return err
}

// setFaultAt corrects when fault i took effect (a fault point fired
// after it was armed): its view is the arming's (Delayed).
func (s *session) setFaultAt(i int, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ev.Faults[i].At, s.ev.Faults[i].Delayed = at, true
}

// heal undoes fault i.
func (s *session) heal(ctx context.Context, i int, what string, do func(context.Context) error) error {
	if err := do(ctx); err != nil {
		return fmt.Errorf("chaos: %s: %w", what, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ev.Faults[i].Healed = time.Now()
	s.logf("healed: %s", what)
	return nil
}

// waitRecovery waits until the job's n-th recovery event arrived.
func (s *session) waitRecovery(ctx context.Context, n int, timeout time.Duration) (*coordpb.JobEvent, error) {
	deadline, stuck := time.Now().Add(timeout), time.Now().Add(stuckAfter)
	for {
		if time.Now().After(stuck) {
			s.takeStacks(ctx, fmt.Sprintf("no recovery %d after %v", n, stuckAfter))
		}
		s.mu.Lock()
		var ev, failed *coordpb.JobEvent
		if len(s.ev.Recoveries) >= n {
			ev = s.ev.Recoveries[n-1]
		}
		if len(s.ev.Failed) > 0 {
			failed = s.ev.Failed[0]
		}
		s.mu.Unlock()
		switch {
		case ev != nil:
			s.logf("recovery %d: step %d, placement %v, sources %v", n, ev.Step, ev.Placement, ev.Sources)
			return ev, nil
		case failed != nil:
			return nil, fmt.Errorf("chaos: the recovery failed: %s", failed.Error)
		case time.Now().After(deadline):
			return nil, fmt.Errorf("chaos: no recovery %d within %v", n, timeout)
		}
		if clock.Sleep(ctx, 100*time.Millisecond) != nil {
			return nil, ctx.Err()
		}
	}
}

// trainOn waits until the job's latest consistent step reaches from+k.
func (s *session) trainOn(ctx context.Context, from, k int64) error {
	_, err := s.waitSnap(ctx, fmt.Sprintf("step %d consistent", from+k), 90*time.Second, func(sn *Snapshot) bool {
		return sn.LatestConsistent() >= from+k
	})
	return err
}

// settle waits until the job has trained Progress steps past its last
// recovery (one may come after the scenario's own waits: a node wrongly
// declared dead while the cluster is still busy healing).
func (s *session) settle(ctx context.Context) error {
	_, err := s.waitSnap(ctx, fmt.Sprintf("%d steps trained past the last recovery", progressSteps), 90*time.Second, func(sn *Snapshot) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		n := len(s.ev.Recoveries)
		if n > len(s.ev.lostFaults()) && n > s.extraSeen {
			s.extraSeen = n
			ev := s.ev.Recoveries[n-1]
			s.logf("note: %d recoveries for %d lost nodes; the last: step %d, %s", n, len(s.ev.lostFaults()), ev.Step, ev.Reason)
		}
		return n == 0 || sn.LatestConsistent() >= s.ev.Recoveries[n-1].Step+progressSteps
	})
	return err
}

// rankNodes returns the nodes running the job's ranks now.
func rankNodes(snap *Snapshot) []string {
	set := map[string]bool{}
	for _, n := range snap.Placement() {
		set[n] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// spares returns the connected nodes running none of the job's ranks.
func spares(snap *Snapshot) []string {
	busy := rankNodes(snap)
	var out []string
	for _, n := range snap.Nodes {
		if !slices.Contains(busy, n.Node) {
			out = append(out, n.Node)
		}
	}
	return out
}

// rankOf returns a rank placed on node (the smallest), or false.
func rankOf(snap *Snapshot, node string) (uint32, bool) {
	for _, r := range slices.Sorted(maps.Keys(snap.Placement())) {
		if snap.Placement()[r] == node {
			return r, true
		}
	}
	return 0, false
}

// pickRankNode picks a node running a rank, and its (smallest) rank.
func (s *session) pickRankNode(snap *Snapshot) (string, uint32, error) {
	node := s.pick(rankNodes(snap))
	rank, ok := rankOf(snap, node)
	if !ok {
		return "", 0, fmt.Errorf("chaos: no rank on %q (placement %v)", node, snap.Placement())
	}
	return node, rank, nil
}

func (s *session) pick(from []string) string {
	if len(from) == 0 {
		return ""
	}
	return from[s.rng.IntN(len(from))]
}

// measure records a scenario-specific detection or recovery time.
func (s *session) measure(detected bool, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if detected {
		s.detected = append(s.detected, d)
	} else {
		s.recovered = append(s.recovered, d)
	}
}

func (s *session) check(c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.extra = append(s.extra, c)
}
