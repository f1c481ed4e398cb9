package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// playAllCopiesCorrupt: every copy of one rank at the newest step
// durable on S3 is corrupt: its NVMe and S3 copies get a byte flipped,
// its node is killed (its memory and NVMe die with it), and every
// replica of that rank in the other nodes' memory gets a byte flipped.
// The recovery must find no good copy of that rank at that step (nor at
// the newer steps whose only copies were those replicas), say so, and
// resume the job whole at the step before that S3 holds intact.
func playAllCopiesCorrupt(ctx context.Context, s *session) error {
	snap, d, err := s.newS3Step(ctx)
	if err != nil {
		return err
	}
	victim := s.pick(rankNodes(snap))
	rank, ok := rankOf(snap, victim)
	if !ok {
		return fmt.Errorf("chaos: no rank on %s (placement %v)", victim, snap.Placement())
	}
	var before []int64
	for _, st := range snap.Durable("s3") {
		if st < d {
			before = append(before, st)
		}
	}
	if len(before) == 0 {
		return fmt.Errorf("chaos: no step durable on s3 before step %d (%v)", d, snap.Durable("s3"))
	}
	want := slices.Max(before)
	what := fmt.Sprintf("corrupt rank %d's tier copies of step %d, kill %s, corrupt its replicas", rank, d, victim)
	i, err := s.inject(ctx, what, victim, true, func(ctx context.Context) error {
		return s.corruptAll(ctx, victim, rank, d, snap)
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ev.Corrupted = append(s.ev.Corrupted, d)
	s.hist.Add(Op{At: s.ev.Faults[i].At, Client: "chaos", Job: s.cfg.Job, Kind: OpRemoved, Step: d, Why: "every copy of rank corrupted"})
	s.mu.Unlock()
	ev, err := s.waitRecovery(ctx, 1, 90*time.Second)
	if err != nil {
		return err
	}
	s.check(skippedReported(ev, d, rank, want))
	return s.trainOn(ctx, ev.Step, progressSteps)
}

// newS3Step waits until a new step is durable on S3, and returns the
// coordinator's view then and that step.
func (s *session) newS3Step(ctx context.Context) (*Snapshot, int64, error) {
	now, err := s.snapshot(ctx)
	if err != nil {
		return nil, 0, err
	}
	prev := newest(now.Durable("s3"))
	snap, err := s.waitSnap(ctx, fmt.Sprintf("a step newer than %d durable on s3", prev), time.Minute, func(sn *Snapshot) bool {
		return newest(sn.Durable("s3")) > prev
	})
	if err != nil {
		return nil, 0, err
	}
	return snap, newest(snap.Durable("s3")), nil
}

// corruptAll corrupts rank's copies of step on the victim's NVMe and on
// S3, kills the victim, then corrupts every replica of rank in the other
// nodes' memory (no new one can come: the rank is dead).
func (s *session) corruptAll(ctx context.Context, victim string, rank uint32, step int64, snap *Snapshot) error {
	var done []string
	tierURL := map[string]string{"nvme": "file:///nvme/rewind", "s3": "s3://rewind/chaos"}
	for _, tier := range []string{"nvme", "s3"} {
		if !durableOn(snap.Step(step), tier) {
			continue
		}
		out, err := s.c.Exec(ctx, victim, "/rewind-dev", "chaos-tool", "corrupt-tier", tier, tierURL[tier],
			"http://minio:9000", s.cfg.Job, fmt.Sprint(step), fmt.Sprint(rank))
		if err != nil {
			return fmt.Errorf("corrupting the %s copy: %w", tier, err)
		}
		done = append(done, tier+": "+strings.TrimSpace(string(out)))
	}
	if err := s.c.Kill(ctx, victim); err != nil {
		return err
	}
	for _, n := range nodeServices {
		if n == victim {
			continue
		}
		out, err := s.c.Exec(ctx, n, "/rewind-dev", "chaos-tool", "corrupt", "/dev/shm/rewind", s.cfg.Job, fmt.Sprint(rank))
		if err != nil {
			if strings.Contains(err.Error(), "no committed segment") || strings.Contains(err.Error(), "no such file") {
				continue // holds no replica of that rank
			}
			return fmt.Errorf("corrupting rank %d's replicas on %s: %w", rank, n, err)
		}
		var c []Corrupted
		if err := json.Unmarshal(out, &c); err != nil {
			return fmt.Errorf("corrupting on %s: %w", n, err)
		}
		done = append(done, fmt.Sprintf("%s memory: %+v", n, c))
	}
	s.logf("corrupted: %s", strings.Join(done, "; "))
	return nil
}

// skippedReported checks that the recovery landed on want (the step
// before the corrupt one on S3) and reported the corrupt step skipped,
// naming the rank.
func skippedReported(ev *coordpb.JobEvent, corrupt int64, rank uint32, want int64) Check {
	c := Check{Name: "the recovery skipped the corrupt step, said so, and resumed at the step before"}
	var skipped []string
	named := false
	for _, sk := range ev.Skipped {
		skipped = append(skipped, fmt.Sprint(sk.Step))
		if sk.Step == corrupt {
			named = slices.ContainsFunc(sk.Ranks, func(r *coordpb.RankFailure) bool { return r.Rank == rank })
		}
	}
	c.Detail = fmt.Sprintf("step %d restored (want %d), steps skipped: %s", ev.Step, want, strings.Join(skipped, ", "))
	switch {
	case ev.Step != want:
	case !named:
		c.Detail += fmt.Sprintf("; step %d is not reported with rank %d", corrupt, rank)
	default:
		c.OK = true
	}
	return c
}
