package agent

import (
	"os"
	"time"
)

// A Prepare reserves a segment out of the node's budget for a save that
// its Commit finishes. A caller that prepares and never commits (a rank
// killed mid-save, a client that lies) would hold that budget for good;
// so a slot still being written PrepareTTL after its Prepare has expired,
// and when a save finds no budget left, expirePrepares takes such slots
// back: their segments are removed and their bytes returned to the
// budget. A Commit that comes later is refused: its slot is gone.
//
// A free slot that still has a segment holds no checkpoint and no save:
// one being written when the agent restarted (reindex frees it: no writer
// can commit it), or a restore's staged copy given up. Its rank reuses it
// at its next save, but a rank that never saves again (it died with its
// job) would keep its bytes from every other job for good; so it goes
// back the same way, at once.

// expirePrepares removes the expired slots being written and the free
// segments (prepareExpired) of every rank but skip (whose lock the caller
// holds; its own slots are reused by its next save anyway) and returns
// the bytes given back to the budget. A rank whose lock is held elsewhere
// is passed over: it is saving.
func (a *Agent) expirePrepares(skip *lockedRank) int64 {
	now := a.cfg.Clock.Now()
	ranks := a.rankList("")
	var freed int64
	for _, r := range ranks {
		if r == skip || !r.mu.TryLock() {
			continue
		}
		freed += a.expireRankPrepares(r, now)
		r.mu.Unlock()
	}
	return freed
}

// expireRankPrepares removes r's expired slots being written and its free
// segments; the caller holds r.mu.
func (a *Agent) expireRankPrepares(r *lockedRank, now time.Time) int64 {
	var freed int64
	keep := r.slots[:0]
	changed := false
	for _, s := range r.slots {
		if !a.prepareExpired(s, now) {
			keep = append(keep, s)
			continue
		}
		if err := a.cfg.FS.Remove(a.paths.Segment(r.job, r.rank, s.Index)); err != nil && !os.IsNotExist(err) {
			a.log.Error("removing the segment of an expired prepare", "job", r.job, "rank", r.rank, "slot", s.Index, "err", err)
			keep = append(keep, s)
			continue
		}
		freed += s.Size
		a.adjustUsed(r.job, -s.Size)
		changed = true
		if s.State == stateFree {
			a.log.Info("a free segment given back to the budget for another rank's save",
				"job", r.job, "rank", r.rank, "slot", s.Index, "bytes", s.Size)
			continue
		}
		a.metrics.preparesExpired.Inc()
		a.log.Warn("a prepare never committed expired: its segment is removed and its budget given back",
			"job", r.job, "rank", r.rank, "step", s.Step, "slot", s.Index, "bytes", s.Size, "prepare_ttl", a.cfg.PrepareTTL)
	}
	r.slots = keep
	if changed {
		if err := a.persist(&r.rankState); err != nil {
			a.log.Error("persisting slots after expiring prepares", "err", err)
		}
	}
	return freed
}

// prepareExpired reports whether s is a slot being written whose Prepare
// is older than PrepareTTL, or a free slot that still has a segment.
func (a *Agent) prepareExpired(s *slot, now time.Time) bool {
	if s.readers > 0 || s.verifying != nil {
		return false
	}
	switch s.State {
	case stateFree:
		return s.Size > 0
	case stateWriting:
		return s.preparedAt.IsZero() || now.Sub(s.preparedAt) >= a.cfg.PrepareTTL
	}
	return false
}
