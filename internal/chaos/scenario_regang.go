package chaos

import (
	"context"
	"time"

	"rewind.dev/rewind/internal/clock"
)

// playCoordinatorRegang kills a rank's node with the coordinator armed to
// exit in the middle of the recovery: after the abort, the move and every
// shard's restore, before the re-gang (fault coordinator/before-regang).
// The restarted coordinator has no memory of that recovery; the aborted
// agents name the gang they hold broken when they reconnect, and it must
// finish the recovery: the job re-ganged, its ranks training on.
func playCoordinatorRegang(ctx context.Context, s *session) error {
	const spec = "coordinator/before-regang=1*exit(137)"
	snap, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	victim := s.pick(rankNodes(snap))
	// Armed before the fault's view is taken, so that the view is the
	// coordinator's right before the kill (arming takes seconds on a
	// loaded machine, while the ranks train on).
	if err := s.c.Faults(ctx, svcCoordinator, spec); err != nil {
		return err
	}
	i, err := s.inject(ctx, "kill "+victim+", the coordinator armed to exit before the re-gang", victim, true, func(ctx context.Context) error {
		return s.c.Kill(ctx, victim)
	})
	if err != nil {
		return err
	}
	at, err := s.waitExit(ctx, svcCoordinator, 30*time.Second)
	if err != nil {
		return err
	}
	s.logf("the coordinator exited before the re-gang, %.0f ms after the kill", at.Sub(s.ev.Faults[i].At).Seconds()*1000)
	down := time.Second + time.Duration(s.rng.Int64N(int64(2*time.Second)))
	_ = clock.Sleep(ctx, time.Until(at.Add(down)))
	if err := s.c.Start(ctx, svcCoordinator); err != nil {
		return err
	}
	s.logf("the coordinator started again")
	ev, err := s.waitRecovery(ctx, 1, 90*time.Second)
	if err != nil {
		return err
	}
	return s.trainOn(ctx, ev.Step, progressSteps)
}
