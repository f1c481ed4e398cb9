package sdk_test

import (
	"testing"
	"time"

	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
)

// The agent restarts after it leased the shard to a restore and before
// it passed the shard's descriptor: the new agent does not know that
// lease. The checkpoint is there, so the restore must not answer
// ErrNotFound (a training loop takes that for "no checkpoint" and starts
// again from step 0): it opens the shard again and returns it.
func TestRestoreWhenTheAgentRestartsAfterItsLease(t *testing.T) {
	cfg := testcluster.AgentConfig(t)
	spec := testcluster.AgentProcess{Node: "child", ShmRoot: cfg.ShmRoot, Socket: cfg.Socket}
	agentProc := testcluster.SpawnAgent(t, spec)
	c := testcluster.Dial(t, cfg.Socket, sdk.Options{CallTimeout: 5 * time.Second})
	s := session(t, c, "lease", 0, 1)
	ctx := ctxT(t)
	for step := int64(1); step <= 2; step++ {
		if err := s.Save(ctx, step, state(step), nil); err != nil {
			t.Fatal(err)
		}
	}
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
