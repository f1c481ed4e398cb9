package nodeproc

import (
	"context"
	"maps"
	"slices"
	"time"
)

// reconcile compares the ranks running here with the coordinator's
// placement: a rank placed elsewhere (its recovery event was missed, e.g.
// across a partition or a pause) is killed; a rank placed here that is
// stopped and was not started by a recovery for RestartAfter is started
// from the latest consistent step. Nothing happens while the coordinator
// does not answer.
func (s *supervisor) reconcile(ctx context.Context) {
	job, err := s.job(ctx)
	if err != nil || job == nil {
		return
	}
	s.op.Lock()
	defer s.op.Unlock()
	running := s.local.Running()
	s.state.Lock()
	kill, start := decide(s.cfg.Node, job.Placement, running, s.ranks, s.lastRegang, time.Now(), s.cfg)
	s.state.Unlock()
	for _, r := range kill {
		s.out.printf("rank %d is placed on %s now: killing it here", r, job.Placement[r])
		s.local.Kill(r)
		s.touch(r, false)
	}
	for _, r := range start {
		s.out.printf("rank %d is placed here but not running: starting it from the latest consistent step", r)
		if err := s.local.Start(map[uint32]string{r: s.cfg.Node}, job.WorldSize, -1); err != nil {
			s.out.printf("%v", err)
		}
	}
}

// decide returns the ranks to kill and to start, given the placement, the
// running ranks and what is known of each (updated: strikes, first
// sightings). The caller holds the state lock.
func decide(node string, placement map[uint32]string, running []uint32, ranks map[uint32]*rankInfo,
	lastRegang, now time.Time, cfg Config) (kill, start []uint32) {
	info := func(r uint32) *rankInfo {
		ri := ranks[r]
		if ri == nil {
			ri = &rankInfo{since: now}
			ranks[r] = ri
		}
		return ri
	}
	for _, r := range running {
		ri := info(r)
		if p := placement[r]; p != "" && p != node {
			if ri.strikes++; ri.strikes >= cfg.MovedStrikes {
				kill = append(kill, r)
			}
			continue
		}
		ri.strikes = 0
	}
	for _, r := range slices.Sorted(maps.Keys(placement)) {
		if placement[r] != node || slices.Contains(running, r) {
			continue
		}
		ri := info(r)
		quiet := ri.since
		if lastRegang.After(quiet) {
			quiet = lastRegang
		}
		if !ri.done && now.Sub(quiet) >= cfg.RestartAfter {
			start = append(start, r)
		}
	}
	return kill, start
}
