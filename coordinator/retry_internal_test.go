package coordinator

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rewind.dev/rewind/internal/wait"
)

// TestFailedRecoveryTriesAreBounded: a job whose recovery fails after its
// plan is tried again Config.RecoveryRetries times in a row, then stalls
// (waits for a node to come back); a recovery that succeeds forgets the
// failed tries.
func TestFailedRecoveryTriesAreBounded(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { c.Close() })
	failed := errors.New("rank 1: the node restoring it is gone")
	state := func() (attempts int, stalled bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if f := c.retrying["j"]; f != nil {
			attempts = f.attempts
		}
		_, stalled = c.stalled["j"]
		return attempts, stalled
	}
	for try := 1; try <= c.cfg.RecoveryRetries; try++ {
		c.retryFailed("j", "node-1", "test", c.cfg.Clock.Now(), failed)
		if attempts, stalled := state(); attempts != try || stalled {
			t.Fatalf("after %d failed tries: %d retries scheduled, stalled %v", try, attempts, stalled)
		}
	}
	c.retryFailed("j", "node-1", "test", c.cfg.Clock.Now(), failed)
	if attempts, stalled := state(); attempts != 0 || !stalled {
		t.Fatalf("after %d failed tries: %d retries scheduled, stalled %v; want none, stalled", c.cfg.RecoveryRetries+1, attempts, stalled)
	}
	c.retryFailed("j", "node-1", "test", c.cfg.Clock.Now(), failed)
	c.unstall("j")
	if attempts, stalled := state(); attempts != 0 || stalled {
		t.Fatalf("after a recovery succeeded: %d retries scheduled, stalled %v", attempts, stalled)
	}
}

// registerOneRankJob registers job of one rank on node, which never
// registered: a recovery of it finds no live node.
func registerOneRankJob(t *testing.T, c *Coordinator, job, node string) {
	t.Helper()
	if _, err := c.apply(func(ch *Changes) error {
		_, err := c.state.RegisterJob(job, 1, map[uint32]string{0: node}, ch)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// retryHeldAtTheJobLock schedules a retry of job's recovery while the
// test holds the job's lock (a recovery of the job in flight, or an
// operator's restart), and returns once the retry's backoff has ended
// and it waits for that lock; unlock lets it go on.
func retryHeldAtTheJobLock(t *testing.T, c *Coordinator, job string) (unlock func()) {
	t.Helper()
	fired := make(chan struct{}, 1)
	c.retryFired = func(string) { fired <- struct{}{} }
	lock := c.jobLock(job)
	lock.Lock()
	var once sync.Once
	unlock = func() { once.Do(lock.Unlock) }
	t.Cleanup(unlock) // before Close (registered earlier, run later)
	c.retryFailed(job, "n0", "test", c.cfg.Clock.Now(), errors.New("the first try failed after its plan"))
	select {
	case <-fired:
	case <-time.After(20 * time.Second):
		t.Fatal("the retry's backoff did not end")
	}
	return unlock
}

// TestARetryDoesNotRecoverAJobRecoveredMeanwhile: while a retry waits for
// the job's lock, the recovery holding it re-gangs the job (unstall). The
// retry, let through, must not recover the healthy gang again (an abort,
// an epoch raised, a restore and a second REGANG its watchers would act
// on).
func TestARetryDoesNotRecoverAJobRecoveredMeanwhile(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { c.Close() })
	registerOneRankJob(t, c, "j", "n0")
	unlock := retryHeldAtTheJobLock(t, c, "j")
	c.unstall("j") // the recovery in flight re-ganged the job
	events, _, cancel := c.watchers.watch("j", false, 0)
	defer cancel()
	unlock()
	select {
	case ev := <-events:
		t.Fatalf("a retry scheduled before the job was re-ganged recovered it after: %v", ev)
	case <-time.After(3 * time.Second):
	}
}

// TestCloseDoesNotWaitForARetrysJobLock: Close waits for a retry's
// backoff, not for the lock of a recovery it does not own (one a node's
// death started runs on until its calls end, up to AgentTimeout).
func TestCloseDoesNotWaitForARetrysJobLock(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	registerOneRankJob(t, c, "j", "n0")
	unlock := retryHeldAtTheJobLock(t, c, "j")
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		unlock()
		<-closed
		t.Fatal("Close waited for the lock of a recovery it does not own")
	}
}

// TestARetryDroppedLeavesNoTries: a retry whose backoff ends while this
// coordinator does not lead is dropped with its count of tries: the
// job's next failed recovery is its first try, of its own node and
// detection time (which its events carry).
func TestARetryDroppedLeavesNoTries(t *testing.T) {
	var leading atomic.Bool
	leading.Store(true)
	c, _ := newLeadTestCoordinator(t, leading.Load)
	registerOneRankJob(t, c, "j", "n0")
	old := c.cfg.Clock.Now()
	leading.Store(false)
	c.retryFailed("j", "n0", "first", old, errors.New("failed after its plan"))
	wait.For(t, 20*time.Second, "the retry dropped", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.retrying["j"] == nil
	})
	leading.Store(true)
	later := old.Add(time.Hour)
	c.retryFailed("j", "n7", "second", later, errors.New("another recovery failed after its plan"))
	c.mu.Lock()
	f := c.retrying["j"]
	c.mu.Unlock()
	if f == nil || f.attempts != 1 || f.node != "n7" || !f.detected.Equal(later) {
		t.Fatalf("a new recovery's failure after a retry was dropped: %+v; want its first try, of node n7 detected at %v", f, later)
	}
}

// TestNodesLostTogetherAreRecoveredOnce: two nodes of a job are declared
// down together (a rack lost) while a recovery of the job holds its lock;
// that recovery moves every lost rank. The recoveries the two deaths
// started then find no rank left on a node declared down: they must not
// restart the gang again.
func TestNodesLostTogetherAreRecoveredOnce(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { c.Close() })
	if _, err := c.apply(func(ch *Changes) error {
		_, err := c.state.RegisterJob("j", 2, map[uint32]string{0: "n0", 1: "n1"}, ch)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	events, _, cancel := c.watchers.watch("j", false, 0)
	defer cancel()
	lock := c.jobLock("j")
	lock.Lock()
	for _, n := range []string{"n0", "n1"} {
		if jobs, err := c.nodeDown(n, "rack lost", false); err != nil || len(jobs) != 1 {
			t.Fatalf("%s down: %v %v", n, jobs, err)
		}
	}
	c.mu.Lock()
	c.state.Jobs["j"].Placement = map[uint32]string{0: "n2", 1: "n3"} // what the recovery holding the lock did
	c.reganged = map[string]time.Time{"j": c.cfg.Clock.Now()}
	c.mu.Unlock()
	lock.Unlock()
	select {
	case ev := <-events:
		t.Fatalf("a recovery of a job whose lost ranks were all moved: %v", ev)
	case <-time.After(3 * time.Second):
	}
}

// TestANodeBackBeforeItsRecoveryIsStillRecovered: a node declared down
// comes back before the recovery its death started takes the job's lock,
// and no re-gang of the job ended since: its ranks may have died with it,
// so the recovery runs.
func TestANodeBackBeforeItsRecoveryIsStillRecovered(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { c.Close() })
	registerOneRankJob(t, c, "j", "n0")
	events, _, cancel := c.watchers.watch("j", false, 0)
	defer cancel()
	lock := c.jobLock("j")
	lock.Lock()
	if _, err := c.nodeDown("n0", "test", false); err != nil {
		t.Fatal(err)
	}
	c.nodeUp("n0")
	lock.Unlock()
	select {
	case ev := <-events:
		if ev.Node != "n0" {
			t.Fatalf("recovery event: %v, want n0's", ev)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the recovery of a node back before it ran never ran")
	}
}

// TestAFailedFinishingRestartIsTriedAgain: a coordinator finishing a
// recovery its predecessor left unfinished restarts the job; a restart
// that fails once the grace is over is tried again as a recovery that
// failed after its plan, not left for an operator.
func TestAFailedFinishingRestartIsTriedAgain(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { c.Close() })
	if _, err := c.apply(func(ch *Changes) error {
		_, err := c.state.RegisterJob("j", 1, nil, ch) // no step: the restart's plan fails
		return err
	}); err != nil {
		t.Fatal(err)
	}
	events, _, cancel := c.watchers.watch("j", false, 0)
	defer cancel()
	c.finishRecovery(context.Background(), "j", 3, c.cfg.Clock.Now(), true, map[string]bool{})
	select {
	case ev := <-events:
		if ev.Ok || !strings.Contains(ev.Reason, "left unfinished") {
			t.Fatalf("the finishing restart's event: %v, want its failure", ev)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no event of the failed finishing restart")
	}
	c.mu.Lock()
	f := c.retrying["j"]
	c.mu.Unlock()
	if f == nil || f.attempts != 1 {
		t.Fatalf("tries of the failed finishing restart: %+v, want one scheduled", f)
	}
}

// TestRetryBackoffStaysBoundedForManyTries: with many tries allowed, the
// backoff doubles up to 30 s and stays there (a shift of a second by the
// try's number overflows past the 34th).
func TestRetryBackoffStaysBoundedForManyTries(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { c.Close() })
	c.cfg.RecoveryRetries = 100
	c.mu.Lock()
	c.retrying = map[string]*failedRecovery{"j": {node: "n0", reason: "test", attempts: 63}}
	c.mu.Unlock()
	fired := make(chan struct{}, 1)
	c.retryFired = func(string) { fired <- struct{}{} }
	c.retryFailed("j", "n0", "test", c.cfg.Clock.Now(), errors.New("failed after its plan"))
	select {
	case <-fired:
		t.Fatal("the 64th try ran at once: its backoff overflowed")
	case <-time.After(2 * time.Second):
	}
}
