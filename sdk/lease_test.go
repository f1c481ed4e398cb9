package sdk_test

import (
	"testing"

	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
)

// The agent restarts after it leased the shard to a restore and before
// it passed the shard's descriptor: the new agent does not know that
// lease. The checkpoint is there, so the restore must not answer
// ErrNotFound (a training loop takes that for "no checkpoint" and starts
// again from step 0): it opens the shard again and returns it.
func TestRestoreWhenTheAgentRestartsAfterItsLease(t *testing.T) {
	spec, agentProc, s := spawnAndSave(t, "lease")
	ctx := ctxT(t)
	restarts := 0
	sdk.SetTestHookLeased(func() {
		if restarts == 0 {
			agentProc.Kill()
			agentProc = testcluster.SpawnAgent(t, spec)
		}
		restarts++
	})
	t.Cleanup(func() { sdk.SetTestHookLeased(nil) })
	mustRestoreState(t, s, 2, state(2))
	if restarts != 2 {
		t.Fatalf("the restore opened the shard %d times, want 2 (once more after the restart)", restarts)
	}
	restarts = 0
	got, err := s.RestoreStep(ctx, 1)
	if err != nil {
		t.Fatalf("restore of step 1 across an agent restart: %v", err)
	}
	same(t, state(1), got)
}
