package coordinator_test

import (
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/shm"
)

// TestAgentCrashMidPrepareIsReconciled: an agent gives up the slot of a
// committed step for a new save and dies before its "deleted" report
// leaves (here the coordinator is down, so the report is only queued, and
// the queue dies with the agent). The coordinator's index still lists the
// copy; once the agent is back, its inventory (which lacks the step)
// removes it, so the index never keeps showing a step as committed by a
// rank whose slot was reused.
func TestAgentCrashMidPrepareIsReconciled(t *testing.T) {
	cl := newCluster(t, 1)
	cl.saveStep("job", 1, 1, 0)
	cl.saveStep("job", 1, 2, 0)
	cl.waitLatest("job", 2)
	// The agent learns that step 2 is consistent from the answer to its
	// next report, or to a rank's question: without it, it would still
	// hold step 1 for the job and refuse its slot to step 3.
	s, _ := cl.clients[0].Session("job", 0, 1)
	if step, _, err := s.LatestConsistent(ctxT(t)); err != nil || step != 2 {
		t.Fatalf("latest consistent step through the agent: %d %v", step, err)
	}
	cl.stop()
	a := cl.agents[0]
	// The two slots hold steps 1 and 2; step 3 takes step 1's slot.
	if _, err := a.Agent.Prepare(ctxT(t), "job", 0, 1, 3, shm.Alignment); err != nil {
		t.Fatal(err)
	}
	a.Stop()
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, cl.addr)
	if got := copiesOf(t, cl, "job", 1); got != 1 {
		t.Fatalf("before the agent is back the index lists %d copies of step 1, want the stale 1", got)
	}
	startAgent(t, a.Config)
	wait.For(t, 10*time.Second, "the restarted agent's inventory to remove step 1, whose slot was reused", func() bool {
		return copiesOf(t, cl, "job", 1) == 0
	})
	cl.waitLatest("job", 2)
}

// copiesOf returns how many copies of step the index lists.
func copiesOf(t *testing.T, cl *cluster, job string, step int64) int {
	t.Helper()
	resp, err := cl.api.ListSteps(ctxT(t), &coordpb.ListStepsRequest{Job: job})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range resp.Steps {
		if st.Step == step {
			return len(st.Copies)
		}
	}
	return 0
}
