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
	"rewind.dev/rewind/internal/clock"
)

// playAllCopiesCorrupt: every copy of one rank at the newest step
// durable on S3 is corrupt: its node is killed (its memory and NVMe die
// with it), its S3 copy gets a byte flipped, and so does every replica of
// that rank in the other nodes' memory. The recovery must find no good
// copy of that rank at that step (nor at the newer steps whose only
// copies were those replicas), say so, and resume the job whole at the
// step before that S3 holds intact.
//
// The coordinator is frozen from just before the kill until the last copy
// is corrupt, and the step to corrupt is read off S3 itself once the node
// is dead: otherwise a recovery quicker than the corruption (a loaded
// machine's docker exec takes seconds) restores from a copy still intact,
// or a newer step reaches S3 while the older one is being corrupted, and
// the scenario tests nothing.
func playAllCopiesCorrupt(ctx context.Context, s *session) error {
	snap, err := s.newS3Step(ctx)
	if err != nil {
		return err
	}
	victim, rank, err := s.pickRankNode(snap)
	if err != nil {
		return err
	}
	var (
		killed time.Time
		c      allCorrupt
	)
	what := fmt.Sprintf("kill %s, corrupt rank %d's copies of the newest step on S3 and its replicas", victim, rank)
	i, err := s.inject(ctx, what, victim, true, func(ctx context.Context) (err error) {
		killed, c, err = s.corruptAll(ctx, victim, rank)
		return err
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ev.Faults[i].At = killed // the view was taken right before: not a delayed fault
	for _, d := range c.corrupt {
		s.ev.Corrupted = append(s.ev.Corrupted, d)
		s.hist.Add(Op{At: killed, Client: "chaos", Job: s.cfg.Job, Kind: OpRemoved, Step: d, Why: "every copy of rank corrupted"})
	}
	s.mu.Unlock()
	ev, err := s.waitRecovery(ctx, 1, 90*time.Second)
	if err != nil {
		return err
	}
	s.check(skippedReported(ev, slices.Max(c.corrupt), rank, c.want))
	return s.trainOn(ctx, ev.Step, progressSteps)
}

// allCorrupt is what corruptAll did: the steps on S3 whose copy of the
// rank it corrupted, and the newest step S3 holds intact before them.
type allCorrupt struct {
	corrupt []int64
	want    int64
}

// corruptAll freezes the coordinator, kills the victim, corrupts rank's
// copy of the newest step on S3 (and of any newer one that lands while it
// does: a push in flight at the kill), then every replica of rank in the
// other nodes' memory (no new one can come: the rank is dead), and thaws
// the coordinator. It returns when the victim was killed.
func (s *session) corruptAll(ctx context.Context, victim string, rank uint32) (killed time.Time, c allCorrupt, err error) {
	err = s.whileFrozen(ctx, func() (kerr error) {
		killed = time.Now()
		c, kerr = s.killAndCorrupt(ctx, victim, rank)
		return kerr
	})
	return killed, c, err
}

// killAndCorrupt is corruptAll's work while the coordinator is frozen.
func (s *session) killAndCorrupt(ctx context.Context, victim string, rank uint32) (c allCorrupt, err error) {
	if err := s.c.Kill(ctx, victim); err != nil {
		return c, err
	}
	var other string
	for _, n := range nodeServices {
		if n != victim {
			other = n
			break
		}
	}
	var done []string
	for range 5 { // until no newer step lands: pushes in flight at the kill are few and short
		steps, err := s.tierSteps(ctx, other)
		if err != nil {
			return c, err
		}
		if len(steps) == 0 {
			break
		}
		d := slices.Max(steps)
		if slices.Contains(c.corrupt, d) {
			break
		}
		out, err := s.c.Exec(ctx, other, "/rewind-dev", "chaos-tool", "corrupt-tier", "s3", "s3://rewind/chaos",
			"http://minio:9000", s.cfg.Job, fmt.Sprint(d), fmt.Sprint(rank))
		if err != nil {
			return c, fmt.Errorf("corrupting the s3 copy of step %d: %w", d, err)
		}
		c.corrupt = append(c.corrupt, d)
		done = append(done, fmt.Sprintf("s3 step %d: %s", d, strings.TrimSpace(string(out))))
		if err := clock.Sleep(ctx, 300*time.Millisecond); err != nil {
			return c, err
		}
	}
	steps, err := s.tierSteps(ctx, other)
	if err != nil {
		return c, err
	}
	c.want = -1
	if len(c.corrupt) > 0 {
		oldest := slices.Min(c.corrupt)
		for _, st := range steps {
			if st < oldest {
				c.want = max(c.want, st)
			}
		}
	}
	if c.want < 0 {
		return c, fmt.Errorf("chaos: S3 holds steps %v: none to corrupt with an older one beside it", steps)
	}
	mem, err := s.corruptReplicas(ctx, victim, rank)
	s.logf("corrupted: %s", strings.Join(append(done, mem...), "; "))
	return c, err
}

// tierSteps lists the job's steps with a whole copy on S3, asking from
// node n.
func (s *session) tierSteps(ctx context.Context, n string) ([]int64, error) {
	out, err := s.c.Exec(ctx, n, "/rewind-dev", "chaos-tool", "tier-steps", "s3", "s3://rewind/chaos", "http://minio:9000", s.cfg.Job)
	if err != nil {
		return nil, fmt.Errorf("listing the steps on s3: %w", err)
	}
	var steps []int64
	if err := json.Unmarshal(out, &steps); err != nil {
		return nil, fmt.Errorf("listing the steps on s3: %q: %w", out, err)
	}
	return steps, nil
}

// newS3Step waits until a new step is durable on S3, and returns the
// coordinator's view then.
func (s *session) newS3Step(ctx context.Context) (*Snapshot, error) {
	now, err := s.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	prev := newest(now.Durable("s3"))
	return s.waitSnap(ctx, fmt.Sprintf("a step newer than %d durable on s3", prev), time.Minute, func(sn *Snapshot) bool {
		return newest(sn.Durable("s3")) > prev
	})
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
			c, err := s.corruptReplicasOn(ctx, n, rank, -1)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if len(c) > 0 {
				done = append(done, fmt.Sprintf("%s memory: %+v", n, c))
			}
		})
	}
	wg.Wait()
	slices.Sort(done)
	return done, errors.Join(errs...)
}

// corruptReplicasOn corrupts the copies of rank in node n's memory of
// steps after after (-1: every one); none when n holds none.
func (s *session) corruptReplicasOn(ctx context.Context, n string, rank uint32, after int64) ([]Corrupted, error) {
	out, err := s.c.Exec(ctx, n, "/rewind-dev", "chaos-tool", "corrupt", "/dev/shm/rewind", s.cfg.Job, fmt.Sprint(rank), fmt.Sprint(after))
	if err != nil {
		if strings.Contains(err.Error(), "no committed segment") || strings.Contains(err.Error(), "no such file") {
			return nil, nil // holds no copy of that rank
		}
		return nil, fmt.Errorf("corrupting rank %d's copies on %s: %w", rank, n, err)
	}
	var c []Corrupted
	if err := json.Unmarshal(out, &c); err != nil {
		return nil, fmt.Errorf("corrupting on %s: %q: %w", n, out, err)
	}
	return c, nil
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
