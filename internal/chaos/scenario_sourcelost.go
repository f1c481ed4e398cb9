package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
)

// restoreHeld is how long each restore fetch waits (fault
// agent/restore-fetched) while playSourceLost finds and kills the node
// it reads from.
const restoreHeld = 6 * time.Second

// playSourceLost: a rank's node is killed and, while the recovery
// restores its rank (each fetch held restoreHeld by a fault armed on every
// other node), the node the restore reads that rank from is killed too:
// the peer holding its replica, or the node restoring it when it reads
// its own memory. The restore in flight loses its source and its node
// may vanish under it. The job must still come back whole: every rank
// resumed at one step restorable without either node, the bytes of each
// restore the ones saved, no recovery failed for good.
func playSourceLost(ctx context.Context, s *session) error {
	return s.loseSource(ctx, "kill", func(ctx context.Context, n string) error { return s.c.Kill(ctx, n) }, "", nil)
}

// playSourceHangs is playSourceLost with the second node frozen (docker
// pause) instead of killed: a call to it is not refused, it goes
// unanswered. Its death, once declared, must end the calls to it that
// the recovery waits on, and the retry must bring the job back within
// sourceHangWait, not after the coordinator's bound on an agent call
// (two minutes). The node is thawed after the recovery and must commit
// nothing of the old gang.
func playSourceHangs(ctx context.Context, s *session) error {
	return s.loseSource(ctx, "pause", func(ctx context.Context, n string) error { return s.c.Pause(ctx, n) },
		"unpause", func(ctx context.Context, n string) error { return s.c.Unpause(ctx, n) })
}

// sourceHangWait bounds the recovery of playSourceHangs: the held fetch
// (restoreHeld), detection (about 1.5 s), a failed try and its retry,
// with room for a loaded machine.
const sourceHangWait = 45 * time.Second

// loseSource kills a rank's node, finds the node its rank's restore reads
// from, and loses that one too (verb, do); undo, when set, brings the
// second node back after the recovery.
func (s *session) loseSource(ctx context.Context, verb string, do func(context.Context, string) error,
	undoVerb string, undo func(context.Context, string) error) error {
	snap, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	victim, rank, err := s.pickRankNode(snap)
	if err != nil {
		return err
	}
	hold := fmt.Sprintf("agent/restore-fetched=sleep(%dms)", restoreHeld.Milliseconds())
	for _, n := range nodeServices {
		if n == victim {
			continue
		}
		if err := s.c.Faults(ctx, n, hold); err != nil {
			return fmt.Errorf("chaos: arming %s on %s: %w", hold, n, err)
		}
	}
	killed := time.Now()
	if _, err := s.inject(ctx, "kill "+victim, victim, true, func(ctx context.Context) error { return s.c.Kill(ctx, victim) }); err != nil {
		return err
	}
	src, err := s.restoreSource(ctx, victim, rank, killed)
	if err != nil {
		return err
	}
	s.logf("rank %d restored on %s from %s", rank, src.restorer, src.source)
	target := src.target()
	disarm := func(n string) error {
		if err := s.c.Faults(ctx, n, ""); err != nil {
			return fmt.Errorf("chaos: disarming the faults on %s: %w", n, err)
		}
		return nil
	}
	for _, n := range nodeServices { // the next recovery's restores run at once
		if n != victim && n != target {
			if err := disarm(n); err != nil {
				return err
			}
		}
	}
	what := fmt.Sprintf("%s %s while it restores rank %d (from %s)", verb, target, rank, src.source)
	if target != src.restorer {
		what = fmt.Sprintf("%s %s, the source of rank %d's restore on %s", verb, target, rank, src.restorer)
	}
	j, err := s.inject(ctx, what, target, true, func(ctx context.Context) error { return do(ctx, target) })
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ev.Faults[j].Joint = true
	s.mu.Unlock()
	wait := 2 * time.Minute
	if undo != nil {
		wait = sourceHangWait
	}
	ev, err := s.waitRecoveryWithout(ctx, []string{victim, target}, wait)
	if err != nil {
		return err
	}
	if err := s.trainOn(ctx, ev.Step, progressSteps); err != nil || undo == nil {
		return err
	}
	if err := s.heal(ctx, j, undoVerb+" "+target, func(ctx context.Context) error { return undo(ctx, target) }); err != nil {
		return err
	}
	if err := disarm(target); err != nil {
		return err
	}
	s.staleNode = target
	after, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	return s.trainOn(ctx, after.LatestConsistent(), progressSteps)
}

// waitRecoveryWithout waits for a successful recovery that placed no rank
// on the down nodes; failed tries are passed over (checkResumed judges
// them).
func (s *session) waitRecoveryWithout(ctx context.Context, down []string, timeout time.Duration) (*coordpb.JobEvent, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		var found *coordpb.JobEvent
		for _, ev := range s.ev.Recoveries {
			if !slices.ContainsFunc(slices.Collect(maps.Values(ev.Placement)), func(n string) bool { return slices.Contains(down, n) }) {
				found = ev
			}
		}
		tries := len(s.ev.Failed)
		s.mu.Unlock()
		if found != nil {
			s.logf("recovery without %v: step %d, placement %v, sources %v, after %d failed tries", down, found.Step, found.Placement, found.Sources, tries)
			return found, nil
		}
		if err := clock.Sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	last := "none failed"
	if n := len(s.ev.Failed); n > 0 {
		last = fmt.Sprintf("%d failed, the last: %s", n, s.ev.Failed[n-1].Error)
	}
	return nil, fmt.Errorf("chaos: no recovery without %v within %v (%s)", down, timeout, last)
}

// restoreRead is where a rank's restore reads it from: the node
// restoring it and its source ("shm:node2", "s3:").
type restoreRead struct {
	restorer, source string
}

// target is the node to kill: the peer whose memory the restore reads,
// or the node restoring the rank when it reads anything else (its own
// memory, a tier).
func (r restoreRead) target() string {
	if tier, node, _ := strings.Cut(r.source, ":"); tier == "shm" && node != "" {
		return node
	}
	return r.restorer
}

// restoreSource waits until a node other than down logs a restore of
// rank from some source after since, and returns it.
func (s *session) restoreSource(ctx context.Context, down string, rank uint32, since time.Time) (restoreRead, error) {
	deadline := time.Now().Add(45 * time.Second)
	want := fmt.Sprintf(" job=%s rank=%d ", s.cfg.Job, rank)
	for time.Now().Before(deadline) {
		for _, n := range nodeServices {
			if n == down {
				continue
			}
			_, stderr, err := s.c.Logs(ctx, n)
			if err != nil {
				return restoreRead{}, err
			}
			for _, l := range linesSince(stderr, since, `msg="restore source: trying"`) {
				if src := logField(l, "source"); strings.Contains(l, want) && src != "" {
					return restoreRead{restorer: n, source: src}, nil
				}
			}
		}
		if err := clock.Sleep(ctx, 200*time.Millisecond); err != nil {
			return restoreRead{}, err
		}
	}
	return restoreRead{}, fmt.Errorf("chaos: no node began restoring rank %d within 45 s of %s's loss", rank, down)
}

// logField returns the value of key in a slog text line ("" if absent).
func logField(line, key string) string {
	_, v, ok := strings.Cut(line, " "+key+"=")
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, " ")
	return strings.Trim(v, `"`)
}

// playRackLoss: two nodes running ranks are killed at once, as a rack or
// its switch is lost. Each death starts a recovery; the job must come
// back once, whole, at a step restorable without both (when they held
// every copy of a rank's newest steps, from the tiers), and train on.
func playRackLoss(ctx context.Context, s *session) error {
	snap, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	nodes := rankNodes(snap)
	first := s.pick(nodes)
	second := s.pick(slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == first }))
	if second == "" {
		return fmt.Errorf("chaos: fewer than two rank nodes (placement %v)", snap.Placement())
	}
	if _, err := s.inject(ctx, "kill "+first, first, true, func(ctx context.Context) error { return s.c.Kill(ctx, first) }); err != nil {
		return err
	}
	j, err := s.inject(ctx, "kill "+second+", in the same rack", second, true, func(ctx context.Context) error { return s.c.Kill(ctx, second) })
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ev.Faults[j].Joint = true
	s.mu.Unlock()
	ev, err := s.waitRecoveryWithout(ctx, []string{first, second}, 2*time.Minute)
	if err != nil {
		return err
	}
	return s.trainOn(ctx, ev.Step, progressSteps)
}
