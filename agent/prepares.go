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

// expirePrepares removes the expired slots being written of every rank but
// skip (whose lock the caller holds; its own slots are reused by its next
// save anyway) and returns the bytes given back to the budget. A rank
// whose lock is held elsewhere is passed over: it is saving.
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

// expireRankPrepares removes r's expired slots being written; the caller
// holds r.mu.
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
		a.adjustUsed(-s.Size)
		changed = true
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
// is older than PrepareTTL. A slot found being written when the agent
// started (reindex) has no writer that can commit it: it is expired.
func (a *Agent) prepareExpired(s *slot, now time.Time) bool {
	if s.State != stateWriting || s.readers > 0 || s.verifying != nil {
		return false
	}
	return s.preparedAt.IsZero() || now.Sub(s.preparedAt) >= a.cfg.PrepareTTL
}
