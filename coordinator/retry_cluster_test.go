package coordinator_test

import (
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/faultinject"
)

// TestAnOperatorRestartInTheBackoffEndsTheRetries: a recovery fails
// after its plan (fault coordinator/before-regang), so a retry is
// scheduled in 1 s. Within that second an operator restarts the job,
// whose restore takes 2.5 s (node-0's fetch held): the retry's backoff
// ends while the restart holds the job's lock. The restart re-gangs the
// job; the retry must then not recover the healthy gang all over again
// (an abort of the running ranks, an epoch raised, a restore, and a
// second REGANG on which every watcher restarts the gang).
func TestAnOperatorRestartInTheBackoffEndsTheRetries(t *testing.T) {
	const job, ws = "spurious", 2
	coordIn, node0 := injector(t, faultinject.CoordBeforeRegang+"=1*error(EIO)"), injector(t, "")
	cl := rackClusterWith(t, 3, func(c *coordinator.Config) { c.Replicas, c.Faults = 1, coordIn }, func(i int, cfg *agent.Config) {
		if i == 0 {
			cfg.Faults = node0
		}
	})
	events := cl.loseNode1(job, ws)
	if ev := nextEvent(t, events); ev.Ok {
		t.Fatalf("recovery cut before its re-gang: %v, want FAILED", ev)
	}
	// The retry fires 1 s after the failure; the restart holds the job
	// from now for 2.5 s.
	mustSet(t, node0, faultinject.AgentRestoreFetched+"=1*sleep(2500ms)")
	plan, err := cl.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, Restart: true, RequestedBy: "test", Force: true})
	if err != nil || !plan.Restarted {
		t.Fatalf("operator restart: %v %v", plan, err)
	}
	ev := nextEvent(t, events)
	if strings.Contains(ev.Reason, "retry") {
		t.Skipf("the retry ran before the restart took the job (%v): the race this test is about did not happen", ev)
	}
	if !ev.Ok || !strings.Contains(ev.Reason, "operator restore") {
		t.Fatalf("event of the operator's restart: %v", ev)
	}
	select {
	case ev := <-events:
		t.Fatalf("after the operator's restart re-ganged the job, a retry scheduled before it re-ganged it again: %v", ev)
	case <-time.After(5 * time.Second):
	}
}

// TestARetryThatFindsNoLiveCopyWaitsForTheNodeToComeBack: the node that
// dies during the restore held the only live copy. Job of one rank on
// node-0, its replica on node-1. node-1's agent dies (not declared);
// node-0 dies and is declared down: the recovery places rank 0 on node-1
// and fails; node-1 is then declared down, and the retry finds no step
// with a live copy: the job stalls, and when node-1 comes back with the
// replica in its memory (its agent registers), the job is recovered.
func TestARetryThatFindsNoLiveCopyWaitsForTheNodeToComeBack(t *testing.T) {
	const job, ws = "onlycopy", 1
	cl := rackCluster(t, 1)
	cl.saveStep(job, ws, 1, 0)
	cl.waitLatest(job, 1)
	waitReplicas(t, cl, job, 1, ws, 2)
	if got := cl.replicaNodes(job, 1)[0]; len(got) != 2 || !strings.Contains(strings.Join(got, ","), "node-1") {
		t.Skipf("rank 0's copies are on %v; the test wants node-0 and node-1", got)
	}
	events := cl.watch(job)
	cl.agents[1].Stop() // the replica's holder dies, not yet declared
	cl.agents[0].Stop()
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-0", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events)
	if ev.Ok {
		t.Fatalf("recovery onto the dead node-1: %v, want FAILED", ev)
	}
	t.Logf("first try: %s", ev.Error)
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(ev.Error, "no consistent step with a live copy") {
		ev = nextEvent(t, events)
		if ev.Ok {
			t.Fatalf("recovery with both copies' nodes down: %v", ev)
		}
		t.Logf("a try: %s (%s)", ev.Error, ev.Reason)
	}
	// node-1 comes back, its memory (rank 0's replica) with it.
	cl.agents[1] = startAgent(t, cl.agents[1].Config)
	for {
		ev = nextEvent(t, events)
		if ev.Ok {
			break
		}
		t.Logf("a try: %s (%s)", ev.Error, ev.Reason)
	}
	if ev.Step != 1 {
		t.Fatalf("recovery once node-1 is back: %v", ev)
	}
}

// TestATierCopyIsVerifiedThroughALiveReader: node-0, alive and
// connected, is declared down by an operator (as failure detection does
// to a saturated node whose agent keeps its connection). A node declared
// down is not called, so a shared tier's copy must be read back through
// another connected agent with the tier (node-1), not the first in name
// order. Suspect checks pick their verifier the same way.
func TestATierCopyIsVerifiedThroughALiveReader(t *testing.T) {
	const job = "reader"
	tc := newTierCluster(t, 2, "pfs:every=1,keep=2", nil, func(c *coordinator.Config) { c.Replicas = 0 })
	s, err := tc.clients[1].Session(job, 0, 1) // the job's one rank on node-1: node-0 runs none
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(ctxT(t), 1, u8(rankData(1, 0)), nil); err != nil {
		t.Fatal(err)
	}
	tc.waitLatest(job, 1)
	tc.waitStarted(job, 1, []string{"pfs"})
	tc.waitTiers(job)
	if v, err := tc.api.VerifyStep(ctxT(t), &coordpb.StepRequest{Job: job, Step: 1}); err != nil || !v.Ok {
		t.Fatalf("verify before node-0 is declared down: %v %v", v, err)
	}
	resp, err := tc.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-0", Reason: "an operator's mistake"})
	if err != nil || len(resp.Jobs) != 0 {
		t.Fatalf("node-0 down: %v %v", resp, err)
	}
	v, err := tc.api.VerifyStep(ctxT(t), &coordpb.StepRequest{Job: job, Step: 1})
	if err != nil || !v.Ok {
		t.Fatalf("verify of step 1 (shm on node-1, pfs) with node-1 alive and connected: %v %v", v, err)
	}
}
