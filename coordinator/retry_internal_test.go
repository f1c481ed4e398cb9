package coordinator

import (
	"errors"
	"path/filepath"
	"testing"
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
