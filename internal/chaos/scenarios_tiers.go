package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
)

// newest returns the last of ascending steps, or -1.
func newest(steps []int64) int64 {
	if len(steps) == 0 {
		return -1
	}
	return steps[len(steps)-1]
}

// degradedOn reports whether any of nodes (any node when none is named)
// shows tier degraded.
func degradedOn(sn *Snapshot, tier string, nodes ...string) bool {
	for _, n := range sn.Nodes {
		if len(nodes) > 0 && !slices.Contains(nodes, n.Node) {
			continue
		}
		if h := sn.Tier(n.Node, tier); h != nil && h.Degraded {
			return true
		}
	}
	return false
}

// outage keeps a fault in place for a random 5 to 10 s after it struck,
// noting when the tier was first seen degraded, then heals it and waits
// until a step newer than the newest durable one before the fault is
// durable on tier again.
func (s *session) outage(ctx context.Context, i int, tier string, nodes []string, healWhat string, heal func(context.Context) error) error {
	s.mu.Lock()
	f := s.ev.Faults[i]
	s.mu.Unlock()
	lastDurable := newest(f.Before.Durable(tier))
	hold := 5*time.Second + time.Duration(s.rng.Int64N(int64(5*time.Second)))
	_, err := s.waitSnap(ctx, tier+" degraded", hold, func(sn *Snapshot) bool { return degradedOn(sn, tier, nodes...) })
	if err == nil {
		s.measure(true, time.Since(f.At))
		s.logf("%s tier degraded after %.1f s", tier, time.Since(f.At).Seconds())
	} else {
		// Measured, not required: the S3 store retries inside one
		// transfer for up to its RetryTimeout before the agent hears of
		// a failure, so a short outage may never show.
		s.logf("%s tier not shown degraded within the %.0f s outage", tier, hold.Seconds())
	}
	if clock.Sleep(ctx, time.Until(f.At.Add(hold))) != nil {
		return ctx.Err()
	}
	// Uploads in flight when the fault struck may still have finished:
	// the copy to wait for is newer than any durable before the healing.
	if sn, err := s.snapshot(ctx); err == nil {
		lastDurable = max(lastDurable, newest(sn.Durable(tier)))
	}
	if err := s.heal(ctx, i, healWhat, heal); err != nil {
		return err
	}
	healed := time.Now()
	snap, err := s.waitSnap(ctx, "a new step durable on "+tier, 3*time.Minute, func(sn *Snapshot) bool {
		return newest(sn.Durable(tier)) > lastDurable
	})
	if err != nil {
		return err
	}
	s.measure(false, time.Since(healed))
	s.logf("step %d durable on %s %.1f s after healing", newest(snap.Durable(tier)), tier, time.Since(healed).Seconds())
	return s.trainOn(ctx, snap.LatestConsistent(), progressSteps)
}

func playMinIOStop(ctx context.Context, s *session) error {
	if _, err := s.waitSnap(ctx, "an upload to s3 running", 30*time.Second, func(sn *Snapshot) bool {
		_, ok := sn.TransferRunning("s3")
		return ok
	}); err != nil {
		s.logf("no upload seen running (%v); stopping MinIO anyway", err)
	}
	i, err := s.inject(ctx, "kill minio", "", false, func(ctx context.Context) error { return s.c.Kill(ctx, svcMinIO) })
	if err != nil {
		return err
	}
	return s.outage(ctx, i, "s3", nil, "start minio", func(ctx context.Context) error { return s.c.Start(ctx, svcMinIO) })
}

func playNVMeFull(ctx context.Context, s *session) error {
	snap, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	victim := s.pick(rankNodes(snap))
	i, err := s.inject(ctx, "fill the NVMe volume of "+victim, victim, false, func(ctx context.Context) error {
		out, err := s.c.Exec(ctx, victim, "/rewind-dev", "chaos-tool", "fill", "/nvme")
		s.logf("%s", strings.TrimSpace(string(out)))
		return err
	})
	if err != nil {
		return err
	}
	return s.outage(ctx, i, "nvme", []string{victim}, "free the NVMe volume of "+victim, func(ctx context.Context) error {
		_, err := s.c.Exec(ctx, victim, "/rewind-dev", "chaos-tool", "unfill", "/nvme")
		return err
	})
}

// waitExit waits until a service's container has stopped with exit
// status 137 (a fault point's exit(137)) and returns when it did.
func (s *session) waitExit(ctx context.Context, svc string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		running, at, code, err := s.c.Running(ctx, svc)
		switch {
		case err == nil && !running && code == 137:
			return at, nil
		case err == nil && !running:
			return at, fmt.Errorf("chaos: %s exited with status %d, not at the fault point's exit(137)", svc, code)
		case time.Now().After(deadline):
			return time.Time{}, fmt.Errorf("chaos: %s still running after %v (%v)", svc, timeout, err)
		}
		if clock.Sleep(ctx, 100*time.Millisecond) != nil {
			return time.Time{}, ctx.Err()
		}
	}
}

func playCoordinatorKill(ctx context.Context, s *session) error {
	const spec = "coordinator/before-consistent=1*exit(137)"
	i, err := s.inject(ctx, "arm "+spec, "", false, func(ctx context.Context) error { return s.c.Faults(ctx, svcCoordinator, spec) })
	if err != nil {
		return err
	}
	at, err := s.waitExit(ctx, svcCoordinator, 30*time.Second)
	if err != nil {
		return err
	}
	s.setFaultAt(i, at)
	s.logf("the coordinator exited at the point, %.0f ms after it was armed", at.Sub(s.ev.Faults[i].Before.At).Seconds()*1000)
	down := time.Second + time.Duration(s.rng.Int64N(int64(2*time.Second)))
	_ = clock.Sleep(ctx, time.Until(at.Add(down)))
	if err := s.heal(ctx, i, "start the coordinator", func(ctx context.Context) error { return s.c.Start(ctx, svcCoordinator) }); err != nil {
		return err
	}
	healed := time.Now()
	before := s.ev.Faults[i].Before.LatestConsistent()
	snap, err := s.waitSnap(ctx, "a step consistent after the restart", 90*time.Second, func(sn *Snapshot) bool {
		return sn.LatestConsistent() > before+1
	})
	if err != nil {
		return err
	}
	s.measure(false, time.Since(healed))
	return s.trainOn(ctx, snap.LatestConsistent(), progressSteps)
}

func playAgentTransfer(ctx context.Context, s *session) error {
	snap, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	victim := s.pick(rankNodes(snap))
	const spec = "agent/tier-uploaded=1*exit(137)"
	i, err := s.inject(ctx, victim+": "+spec, victim, true, func(ctx context.Context) error { return s.c.Faults(ctx, victim, spec) })
	if err != nil {
		return err
	}
	at, err := s.waitExit(ctx, victim, 60*time.Second)
	if err != nil {
		return err
	}
	s.setFaultAt(i, at)
	s.logf("%s exited after a tier upload", victim)
	ev, err := s.waitRecovery(ctx, 1, 90*time.Second)
	if err != nil {
		return err
	}
	if err := s.trainOn(ctx, ev.Step, progressSteps); err != nil {
		return err
	}
	// The node comes back empty and joins as a spare.
	if err := s.c.Start(ctx, victim); err != nil {
		return err
	}
	_, err = s.waitSnap(ctx, victim+" connected again", 90*time.Second, func(sn *Snapshot) bool {
		return slices.ContainsFunc(sn.Nodes, func(n *coordpb.NodeTiers) bool { return n.Node == victim })
	})
	s.check(Check{Name: "the node rejoins after its restart", OK: err == nil, Detail: fmt.Sprint(orOK(err))})
	return nil
}

func orOK(err error) any {
	if err == nil {
		return "connected to the coordinator again"
	}
	return err
}
