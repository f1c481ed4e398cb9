package coordinator_test

import (
	"strings"
	"testing"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/membership"
)

// TestRecoveryRetriedWhenANodeComesBack: every node of a job is declared
// dead (as failure detection does to live nodes under CPU saturation), so
// its re-gang finds no live node and fails. When a node answers again
// (its agent registers), the re-gang is retried, once, and the job runs
// again from its newest step instead of staying down for good.
func TestRecoveryRetriedWhenANodeComesBack(t *testing.T) {
	const job, ws = "retry", 1
	cl := rackClusterWith(t, 1, func(*coordinator.Config) {}, nil)
	cl.saveSteps(job, ws, 2, 0)
	events := cl.watch(job)
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-0", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events)
	if ev.Kind != coordpb.JobEventKind_JOB_EVENT_KIND_FAILED || !strings.Contains(ev.Error, "no live node") {
		t.Fatalf("re-gang with every node down: %v, want FAILED for want of a live node", ev)
	}
	// node-0's agent comes back: it registers again, with its memory.
	cl.agents[0].Stop()
	cl.agents[0] = startAgent(t, cl.agents[0].Config)
	ev = nextEvent(t, events)
	if !ev.Ok || ev.Kind != coordpb.JobEventKind_JOB_EVENT_KIND_REGANG || ev.Step != 2 || ev.Placement[0] != "node-0" {
		t.Fatalf("event once node-0 is back: %v, want the job re-ganged on node-0 at step 2", ev)
	}
	if ev.Sources["shm"] != 1 {
		t.Fatalf("sources %v, want rank 0 restored from node-0's memory", ev.Sources)
	}
}

// TestRecoveryRetriedWhenAFalselyDeadNodeAnswers: failure detection
// declares the only node of a job dead while its agent lives on (its
// gossip is cut from the coordinator's; its gRPC connection is not, so it
// never registers again). The re-gang fails for want of a live node. Once
// the gossip heals and the node answers a direct ping it is back, and
// the job is re-ganged on it.
func TestRecoveryRetriedWhenAFalselyDeadNodeAnswers(t *testing.T) {
	const job, ws = "falsely-dead", 1
	faults := membership.NewFaultNetwork()
	// A cluster of two members has no majority without both: the quorum
	// check is not what this test is about.
	cl, seed := gossipCoordinator(t, faults, func(cfg *coordinator.Config) {
		cfg.Replicas, cfg.Quorum = 0, func() bool { return true }
	})
	cl.addAgent(func(cfg *agent.Config) {
		g := testcluster.GossipConfig(faults)
		cfg.Node, cfg.FailureDomain = "node-0", "rack-a"
		cfg.Gossip, cfg.GossipJoin = &g, []string{seed}
	})
	cl.waitOrderStreams()
	cl.saveSteps(job, ws, 1, 0)
	events := cl.watch(job)
	faults.Cut("coordinator", "node-0")
	ev := nextEvent(t, events)
	if ev.Kind != coordpb.JobEventKind_JOB_EVENT_KIND_FAILED || !strings.Contains(ev.Error, "no live node") || !strings.Contains(ev.Reason, "declared dead") {
		t.Fatalf("re-gang with the job's only node declared dead: %v, want FAILED for want of a live node", ev)
	}
	faults.Heal()
	ev = nextEvent(t, events)
	if !ev.Ok || ev.Kind != coordpb.JobEventKind_JOB_EVENT_KIND_REGANG || ev.Step != 1 || ev.Placement[0] != "node-0" {
		t.Fatalf("event once node-0 answers again: %v, want the job re-ganged on node-0 at step 1", ev)
	}
}
