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

// gang holds the jobs whose gang is broken, until the coordinator says
// the recovery is done.
type gang struct {
	mu     sync.Mutex
	broken map[string]brokenGang
}

type brokenGang struct {
	step   int64
	reason string
}

func (g *gang) abort(job string, step int64, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.broken == nil {
		g.broken = map[string]brokenGang{}
	}
	g.broken[job] = brokenGang{step: step, reason: reason}
}

func (g *gang) resume(job string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.broken, job)
}

// check returns ErrGangBroken, with what the rank should do, for a job
// being recovered.
func (g *gang) check(job string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.broken[job]
	if !ok {
		return nil
	}
	return fmt.Errorf("%w: job %s: %s; restoring step %d: exit, and the job restarts from it", ErrGangBroken, job, b.reason, b.step)
}
