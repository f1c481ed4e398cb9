package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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
	var killed time.Time
	i, err := s.inject(ctx, what, victim, true, func(ctx context.Context) (err error) {
		killed, err = s.corruptAll(ctx, victim, rank, d, snap)
		return err
	})
	if err != nil {
		return err
	}
	s.setFaultAt(i, killed)
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
// nodes' memory (no new one can come: the rank is dead). The coordinator
// is frozen from just before the kill until the last replica is
// corrupt: otherwise a recovery quicker than the corruption (a loaded
// machine's docker exec takes seconds) restores the newest step from a
// replica still intact, and the scenario tests nothing. It returns when
// the victim was killed.
func (s *session) corruptAll(ctx context.Context, victim string, rank uint32, step int64, snap *Snapshot) (killed time.Time, err error) {
	var done []string
	tierURL := map[string]string{"nvme": "file:///nvme/rewind", "s3": "s3://rewind/chaos"}
	for _, tier := range []string{"nvme", "s3"} {
		if !durableOn(snap.Step(step), tier) {
			continue
		}
		out, err := s.c.Exec(ctx, victim, "/rewind-dev", "chaos-tool", "corrupt-tier", tier, tierURL[tier],
			"http://minio:9000", s.cfg.Job, fmt.Sprint(step), fmt.Sprint(rank))
		if err != nil {
			return killed, fmt.Errorf("corrupting the %s copy: %w", tier, err)
		}
		done = append(done, tier+": "+strings.TrimSpace(string(out)))
	}
	if err := s.c.Pause(ctx, svcCoordinator); err != nil {
		return killed, fmt.Errorf("freezing the coordinator: %w", err)
	}
	defer func() {
		if uerr := s.c.Unpause(context.WithoutCancel(ctx), svcCoordinator); uerr != nil && err == nil {
			err = fmt.Errorf("thawing the coordinator: %w", uerr)
		}
	}()
	killed = time.Now()
	if err := s.c.Kill(ctx, victim); err != nil {
		return killed, err
	}
	mem, err := s.corruptReplicas(ctx, victim, rank)
	s.logf("corrupted: %s", strings.Join(append(done, mem...), "; "))
	return killed, err
}

// corruptReplicas corrupts every replica of rank in the memory of the
// nodes other than victim, all nodes at once.
func (s *session) corruptReplicas(ctx context.Context, victim string, rank uint32) ([]string, error) {
	var (
		mu   sync.Mutex
		done []string
		errs []error
		wg   sync.WaitGroup
	)
	for _, n := range nodeServices {
		if n == victim {
			continue
		}
		wg.Go(func() {
			line, err := s.corruptReplicasOn(ctx, n, rank)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if line != "" {
				done = append(done, line)
			}
		})
	}
	wg.Wait()
	slices.Sort(done)
	return done, errors.Join(errs...)
}

// corruptReplicasOn corrupts every replica of rank in node n's memory
// and says which ("" when n holds none).
func (s *session) corruptReplicasOn(ctx context.Context, n string, rank uint32) (string, error) {
	out, err := s.c.Exec(ctx, n, "/rewind-dev", "chaos-tool", "corrupt", "/dev/shm/rewind", s.cfg.Job, fmt.Sprint(rank))
	if err != nil {
		if strings.Contains(err.Error(), "no committed segment") || strings.Contains(err.Error(), "no such file") {
			return "", nil // holds no replica of that rank
		}
		return "", fmt.Errorf("corrupting rank %d's replicas on %s: %w", rank, n, err)
	}
	var c []Corrupted
	if err := json.Unmarshal(out, &c); err != nil {
		return "", fmt.Errorf("corrupting on %s: %w", n, err)
	}
	return fmt.Sprintf("%s memory: %+v", n, c), nil
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
