package chaos

import (
	"context"
	"fmt"
	"time"

	"rewind.dev/rewind/internal/clock"
)

// coordCutFor is how long playCoordinatorPartition cuts the coordinator
// off: several times failure detection's time to declare a node dead.
const coordCutFor = 6 * time.Second

// playCoordinatorPartition: the coordinator is cut off from every node
// (docker network disconnect) while the job trains, and reconnected at
// its address 6 s later. Cut off, it hears every node go silent at once;
// with no quorum of the cluster reachable it must declare none dead and
// start no recovery, and the nodes, which still reach one another, must
// not either. Healed, the job must train on: no rank restarted, no save
// failed, the latest consistent step moving on from where it was.
func playCoordinatorPartition(ctx context.Context, s *session) error {
	before, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	from := before.LatestConsistent()
	i, err := s.inject(ctx, fmt.Sprintf("disconnect the coordinator for %v", coordCutFor), "", false, func(ctx context.Context) error {
		return s.c.Disconnect(ctx, svcCoordinator)
	})
	if err != nil {
		return err
	}
	start := time.Now()
	if err := clock.Sleep(ctx, coordCutFor); err != nil {
		return err
	}
	if err := s.heal(ctx, i, "reconnect the coordinator", func(ctx context.Context) error { return s.c.Connect(ctx, svcCoordinator) }); err != nil {
		return err
	}
	after, err := s.waitSnap(ctx, fmt.Sprintf("a step past %d consistent after the heal", from), time.Minute, func(sn *Snapshot) bool {
		return sn.LatestConsistent() > from
	})
	if err != nil {
		return err
	}
	if err := s.trainOn(ctx, after.LatestConsistent(), progressSteps); err != nil {
		return err
	}
	s.check(s.noFailedSaves(ctx, start))
	s.mu.Lock()
	recoveries, failed := len(s.ev.Recoveries), len(s.ev.Failed)
	s.mu.Unlock()
	s.check(Check{Name: "no node was declared dead", OK: recoveries+failed == 0,
		Detail: fmt.Sprintf("%d recoveries, %d failed", recoveries, failed)})
	return nil
}
