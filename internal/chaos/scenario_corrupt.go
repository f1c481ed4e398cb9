package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
)

// playCorruptReplica: with two replicas of every shard, a rank's node
// hangs (docker pause: it commits nothing more, so the replicas its peers
// hold are the newest copies), and the copies of that rank the spare holds
// rot in memory: one byte of each flipped in place, after the agent had
// verified them. The recovery places the rank on the spare, whose own copy
// is the cheapest source: the restore must notice the bad checksum and
// fall back to the intact replica on another node. The hung node is then
// thawed and must commit nothing of the old gang.
//
// The coordinator is frozen meanwhile, and the rank's copies on the other
// nodes of steps newer than any the spare holds are corrupted too: a step
// whose replica to the spare was still in flight at the pause would
// otherwise be restored from the other node, and the fallback never
// tried.
func playCorruptReplica(ctx context.Context, s *session) error {
	spare, victim, rank, err := s.corruptSetup(ctx)
	if err != nil {
		return err
	}
	var corrupted []Corrupted
	i, err := s.inject(ctx, fmt.Sprintf("pause %s, corrupt rank %d's copies on %s", victim, rank, spare), victim, true, func(ctx context.Context) (err error) {
		corrupted, err = s.corruptOnSpare(ctx, spare, victim, rank)
		return err
	})
	if err != nil {
		return err
	}
	s.logf("corrupted on %s: %+v", spare, corrupted)
	ev, err := s.waitRecovery(ctx, 1, 90*time.Second)
	if err != nil {
		return err
	}
	if err := s.trainOn(ctx, ev.Step, progressSteps); err != nil {
		return err
	}
	s.check(s.fallbackSeen(ctx, spare, s.ev.Faults[i].At, ev.Step, corrupted))
	if err := s.heal(ctx, i, "unpause "+victim, func(ctx context.Context) error { return s.c.Unpause(ctx, victim) }); err != nil {
		return err
	}
	s.staleNode = victim
	after, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	return s.trainOn(ctx, after.LatestConsistent(), progressSteps)
}

// corruptOnSpare freezes the coordinator, pauses the victim, lets the
// copies in flight land, corrupts every copy of rank on the spare and, on
// the other live nodes, those of steps newer than the spare's newest, and
// thaws the coordinator. It returns what it corrupted on the spare.
func (s *session) corruptOnSpare(ctx context.Context, spare, victim string, rank uint32) (corrupted []Corrupted, err error) {
	err = s.whileFrozen(ctx, func() error {
		if err := s.c.Pause(ctx, victim); err != nil {
			return err
		}
		if err := clock.Sleep(ctx, 300*time.Millisecond); err != nil {
			return err
		}
		if corrupted, err = s.corruptReplicasOn(ctx, spare, rank, -1); err != nil {
			return err
		}
		if len(corrupted) == 0 {
			return fmt.Errorf("chaos: %s holds no copy of rank %d", spare, rank)
		}
		held := int64(-1)
		for _, c := range corrupted {
			held = max(held, c.Step)
		}
		for _, n := range nodeServices {
			if n == spare || n == victim {
				continue
			}
			newer, err := s.corruptReplicasOn(ctx, n, rank, held)
			if err != nil {
				return err
			}
			if len(newer) > 0 {
				s.logf("corrupted on %s, newer than the spare's: %+v", n, newer)
			}
		}
		return nil
	})
	return corrupted, err
}

// corruptSetup gives the job two replicas per shard and picks the spare
// and a rank's node whose newest consistent step the spare holds a
// replica of; it returns right after such a step became consistent.
func (s *session) corruptSetup(ctx context.Context) (spare, victim string, rank uint32, err error) {
	replicas := uint32(2)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = s.c.API.RegisterJob(cctx, &coordpb.RegisterJobRequest{Job: s.cfg.Job, WorldSize: s.cfg.WorldSize, Replicas: &replicas})
	cancel()
	if err != nil {
		return "", "", 0, fmt.Errorf("chaos: setting two replicas: %w", err)
	}
	snap, err := s.waitSnap(ctx, "every rank of the latest step in three nodes' memory", time.Minute, func(sn *Snapshot) bool {
		st := sn.LatestConsistent()
		for r := range s.cfg.WorldSize {
			if len(sn.Holders(st, r)) < 3 {
				return false
			}
		}
		return st >= 0
	})
	if err != nil {
		return "", "", 0, err
	}
	spare = s.pick(spares(snap))
	var victims []string
	for _, n := range rankNodes(snap) {
		if r, ok := rankOf(snap, n); ok && slices.Contains(snap.Holders(snap.LatestConsistent(), r), spare) {
			victims = append(victims, n)
		}
	}
	if victim = s.pick(victims); spare == "" || victim == "" {
		return "", "", 0, fmt.Errorf("chaos: no spare holding a replica of a rank (spares %v, placement %v)", spares(snap), snap.Placement())
	}
	rank, _ = rankOf(snap, victim)
	prev := snap.LatestConsistent()
	_, err = s.waitSnap(ctx, fmt.Sprintf("a new step consistent with rank %d's replica on %s", rank, spare), 30*time.Second, func(sn *Snapshot) bool {
		l := sn.LatestConsistent()
		return l > prev && slices.Contains(sn.Holders(l, rank), spare)
	})
	return spare, victim, rank, err
}

// fallbackSeen checks that the restore on node met a corrupt copy and
// passed over it: its agent logged a failed source after the fault. The
// restored step must be one whose copy there was corrupted.
func (s *session) fallbackSeen(ctx context.Context, node string, after time.Time, step int64, corrupted []Corrupted) Check {
	c := Check{Name: "the restore detected the corrupt copy and fell back"}
	if !slices.ContainsFunc(corrupted, func(x Corrupted) bool { return x.Step == step }) {
		c.Detail = fmt.Sprintf("step %d was restored, but the corrupted copies on %s were of other steps (%+v)", step, node, corrupted)
		return c
	}
	_, stderr, err := s.c.Logs(ctx, node)
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	if failed := linesSince(stderr, after, "restore source failed"); len(failed) > 0 {
		c.OK = true
		c.Detail = "its agent: " + shorten(failed[0], 240)
		return c
	}
	c.Detail = fmt.Sprintf("%s held a corrupt copy of step %d, but its agent logged no failed restore source", node, step)
	return c
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
