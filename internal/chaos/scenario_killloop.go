package chaos

import (
	"context"
	"fmt"
	"time"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/clock"
)

// coordinatorKills is how many times coordinator-kill-loop kills the
// coordinator.
const coordinatorKills = 20

// killPoints are where coordinator-kill-loop kills the coordinator: at a
// fault point of the commit path (armed to exit(137) at its next hit:
// before a consistent step is stored, after it is stored and before any
// answer), or, for "", with SIGKILL at a random moment.
var killPoints = []string{faultinject.CoordBeforeConsistent, faultinject.CoordConsistentStored, ""}

// playCoordinatorKillLoop SIGKILLs the coordinator coordinatorKills
// times while the job commits, each time restarting it after 0.2 to 1 s
// and waiting for the job to make a step consistent through it. What the
// latest-step poller saw (the history checker) must never go back, and
// the job must train on without a restart of any rank.
func playCoordinatorKillLoop(ctx context.Context, s *session) error {
	for k := range coordinatorKills {
		point := killPoints[s.rng.IntN(len(killPoints))]
		i, err := s.killCoordinator(ctx, k, point)
		if err != nil {
			return err
		}
		down := 200*time.Millisecond + time.Duration(s.rng.Int64N(int64(800*time.Millisecond)))
		_ = clock.Sleep(ctx, down)
		if err := s.heal(ctx, i, "start the coordinator", func(ctx context.Context) error { return s.c.Start(ctx, svcCoordinator) }); err != nil {
			return err
		}
		healed := time.Now()
		before := s.ev.Faults[i].Before.LatestConsistent()
		if _, err := s.waitSnap(ctx, fmt.Sprintf("a step consistent after restart %d", k+1), 90*time.Second, func(sn *Snapshot) bool {
			return sn.LatestConsistent() > before
		}); err != nil {
			return err
		}
		s.measure(false, time.Since(healed))
	}
	snap, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	return s.trainOn(ctx, snap.LatestConsistent(), progressSteps)
}

// killCoordinator kills the coordinator at point (see killPoints), the
// k-th time, and returns the fault's index once it is down.
func (s *session) killCoordinator(ctx context.Context, k int, point string) (int, error) {
	if point == "" {
		_ = clock.Sleep(ctx, time.Duration(s.rng.Int64N(int64(time.Second))))
		return s.inject(ctx, fmt.Sprintf("kill %d: SIGKILL the coordinator", k+1), "", false,
			func(ctx context.Context) error { return s.c.Kill(ctx, svcCoordinator) })
	}
	spec := point + "=1*exit(137)"
	i, err := s.inject(ctx, fmt.Sprintf("kill %d: arm %s", k+1, spec), "", false,
		func(ctx context.Context) error { return s.c.Faults(ctx, svcCoordinator, spec) })
	if err != nil {
		return 0, err
	}
	at, err := s.waitExit(ctx, svcCoordinator, 30*time.Second)
	if err != nil {
		return 0, err
	}
	s.setFaultAt(i, at)
	return i, nil
}
