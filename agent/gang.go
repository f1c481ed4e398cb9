package agent

import (
	"errors"
	"fmt"
	"sync"
)

// ErrGangBroken is returned to a job's ranks while the coordinator
// recovers the job after losing a node: a rank still alive must not go on
// (its peers in a collective are gone), but exit and be restarted, then
// restore the step the error names.
var ErrGangBroken = errors.New("gang broken")

// gang holds the jobs whose gang is broken. From the abort on, a rank may
// save again only once it has restored the step the recovery names: a
// process of the old gang that is still alive (its driver has not killed
// it yet) never does, so it can never commit a step of the old timeline,
// while the restarted rank, which restores first, goes on.
type gang struct {
	mu     sync.Mutex
	broken map[string]*brokenGang
}

type brokenGang struct {
	step     int64
	reason   string
	resumed  bool            // the recovery is done
	restored map[uint32]bool // ranks that restored step since the abort
}

func (g *gang) abort(job string, step int64, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.broken == nil {
		g.broken = map[string]*brokenGang{}
	}
	g.broken[job] = &brokenGang{step: step, reason: reason, restored: map[uint32]bool{}}
}

// brokenJobs returns the jobs whose gang is broken here and not resumed,
// with the step each abort named.
func (g *gang) brokenJobs() map[string]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string]int64{}
	for job, b := range g.broken {
		if !b.resumed {
			out[job] = b.step
		}
	}
	return out
}

// breaking reports whether job's gang is broken here and not resumed.
func (g *gang) breaking(job string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.broken[job]
	return b != nil && !b.resumed
}

// resume ends the job's break, whatever step it named: the coordinator
// says the job runs again from step. (A break at another step is one
// whose own resume this agent missed, its node down at the time.)
func (g *gang) resume(job string, step int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := g.broken[job]; b != nil && !b.resumed {
		if b.step != step { // a rank restored the old step, not this one
			b.step, b.restored = step, map[uint32]bool{}
		}
		b.resumed = true
	}
}

// opened notes that rank opened step of job for a restore.
func (g *gang) opened(job string, rank uint32, step int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := g.broken[job]; b != nil && b.step == step {
		b.restored[rank] = true
	}
}

// check returns ErrGangBroken, with what the rank should do, for a rank of
// a job being recovered that has not restored the recovery's step; rank
// < 0 asks for the job (a rank's question about the job's state), which is
// answered again once the recovery is done.
func (g *gang) check(job string, rank int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.broken[job]
	if b == nil || rank >= 0 && b.restored[uint32(rank)] || rank < 0 && b.resumed {
		return nil
	}
	state := "restoring"
	if b.resumed {
		state = "restored"
	}
	return fmt.Errorf("%w: job %s: %s; %s step %d: exit, and the job restarts from it", ErrGangBroken, job, b.reason, state, b.step)
}

// discardAfter deletes the job's shards of steps after step, on this node:
// the job resumes from step, and no rank continues those (a later save of
// the same step number must not find them, nor a slot be held by them).
func (a *Agent) discardAfter(job string, step int64) {
	n := 0
	for _, sh := range a.List(job) {
		if sh.State != stateCommitted || sh.Step <= step {
			continue
		}
		if _, _, err := a.Delete(job, sh.Rank, false, sh.Step); err != nil {
			a.log.Warn("discarding a step after the one the job resumes from", "job", job, "rank", sh.Rank, "step", sh.Step, "err", err)
			continue
		}
		n++
	}
	if n > 0 {
		a.log.Info("discarded steps after the one the job resumes from", "job", job, "step", step, "shards", n)
	}
}
