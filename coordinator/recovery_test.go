package coordinator_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// rackCluster is a coordinator keeping replicas copies of every shard and
// three agents: node-0 and node-2 in rack-a, node-1 in rack-b. The
// recovery tests run rank 0 on node-0, rank 1 on node-1 and keep node-2
// spare.
func rackCluster(t *testing.T, replicas int) *cluster {
	return rackClusterWith(t, 3, func(c *coordinator.Config) { c.Replicas = replicas }, nil)
}

// rackClusterWith is rackCluster of n nodes (node-i in rack-a for even i,
// rack-b for odd), with the coordinator's configuration and each agent's
// changed by the mods (a nil agentMod changes none).
func rackClusterWith(t *testing.T, n int, coordMod func(*coordinator.Config), agentMod func(i int, cfg *agent.Config)) *cluster {
	cl := &cluster{t: t, dataDir: t.TempDir()}
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, "127.0.0.1:0", coordMod)
	cl.dial()
	for i := range n {
		cl.addAgent(func(cfg *agent.Config) {
			cfg.Node, cfg.FailureDomain = fmt.Sprintf("node-%d", i), []string{"rack-a", "rack-b"}[i%2]
			if agentMod != nil {
				agentMod(i, cfg)
			}
		})
	}
	cl.waitOrderStreams()
	return cl
}

// watch subscribes to job's events; it returns once the coordinator has
// the subscription, so no event published from then on is missed.
func (cl *cluster) watch(job string) <-chan *coordpb.JobEvent {
	ch := make(chan *coordpb.JobEvent, 4)
	stream, err := cl.api.WatchJob(ctxT(cl.t), &coordpb.WatchJobRequest{Job: job})
	if err != nil {
		cl.t.Fatal(err)
	}
	// The coordinator sends the header once it has subscribed the stream.
	if _, err := stream.Header(); err != nil {
		cl.t.Fatal(err)
	}
	go func() {
		for {
			ev, err := stream.Recv()
			if err != nil {
				close(ch)
				return
			}
			ch <- ev
		}
	}()
	return ch
}

// loseNode1 saves step 1 of job (ranks 0 and 1 of ws, on node-0 and
// node-1), waits until it is consistent and replicated, then stops
// node-1's agent and declares it down; it returns the job's events from
// before the loss.
func (cl *cluster) loseNode1(job string, ws uint32) <-chan *coordpb.JobEvent {
	t := cl.t
	t.Helper()
	cl.saveStep(job, ws, 1, 0, 1)
	cl.waitLatest(job, 1)
	waitReplicas(t, cl, job, 1, ws, 2)
	events := cl.watch(job)
	cl.agents[1].Stop()
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	return events
}

func nextEvent(t *testing.T, ch <-chan *coordpb.JobEvent) *coordpb.JobEvent {
	t.Helper()
	select {
	case ev := <-ch:
		if ev == nil {
			t.Fatal("watch stream ended")
		}
		return ev
	case <-time.After(20 * time.Second):
		t.Fatal("no job event within 20 s")
	}
	return nil
}

// TestRecoveryAfterANodeDies: node-1 dies after step 3 is consistent and
// rank 0 has saved step 4 alone. The coordinator moves rank 1 to the
// spare node, restores step 3 there from the replica, drops step 4 (no
// rank continues it), and tells the job's watcher where to restart which
// ranks; the shards are in place, bit-identical; saves go on.
func TestRecoveryAfterANodeDies(t *testing.T) {
	const job, ws = "recover", 2
	cl := rackCluster(t, 1)
	cl.saveSteps(job, ws, 3, 0, 1)
	waitReplicas(t, cl, job, 3, ws, 2)
	cl.saveStep(job, ws, 4, 0)
	events := cl.watch(job)
	cl.agents[1].Stop() // node-1 dies with its memory
	resp, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1", Reason: "test"})
	if err != nil || len(resp.Jobs) != 1 {
		t.Fatalf("node down: %v %v", resp, err)
	}
	ev := nextEvent(t, events)
	if !ev.Ok || ev.Kind != coordpb.JobEventKind_JOB_EVENT_KIND_REGANG || ev.Step != 3 || ev.Placement[0] != "node-0" || ev.Placement[1] != "node-2" {
		t.Fatalf("recovery event: %v", ev)
	}
	if ev.DetectedUnixNano == 0 || ev.PlannedUnixNano < ev.DetectedUnixNano || ev.RestoredUnixNano < ev.PlannedUnixNano {
		t.Fatalf("timeline: %v", ev)
	}
	// Step 4 is gone; the job's latest is 3.
	if _, err := cl.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: 4}); err == nil {
		t.Fatal("step 4, which no rank continues, is still in the index")
	}
	cl.waitLatest(job, 3)
	for rank, node := range map[uint32]int{0: 0, 1: 2} {
		s, _ := cl.clients[node].Session(job, rank, ws)
		got, err := s.RestoreStep(ctxT(t), 3)
		if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(3, rank)) {
			t.Fatalf("rank %d on node-%d after the recovery: %v", rank, node, err)
		}
	}
	// The new gang saves step 4 again: rank 0 on node-0, rank 1 on node-2.
	for rank, node := range map[uint32]int{0: 0, 1: 2} {
		s, _ := cl.clients[node].Session(job, rank, ws)
		if err := s.Save(ctxT(t), 4, []sdk.Tensor{{Name: "w", DType: shm.U8, Shape: []int64{4096}, Data: rankData(40, rank)}}, nil); err != nil {
			t.Fatalf("save after the recovery, rank %d: %v", rank, err)
		}
	}
	cl.waitLatest(job, 4)
}

// TestRecoveryImpossible: without replicas, the dead node's rank has no
// copy anywhere: the recovery fails with an error that says so, and the
// ranks still alive stay told that the gang is broken.
func TestRecoveryImpossible(t *testing.T) {
	const job, ws = "lost", 2
	cl := rackCluster(t, 0)
	cl.saveStep(job, ws, 1, 0, 1)
	cl.waitLatest(job, 1)
	events := cl.watch(job)
	cl.agents[1].Stop()
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1"}); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events)
	if ev.Ok || ev.Kind != coordpb.JobEventKind_JOB_EVENT_KIND_FAILED || !strings.Contains(ev.Error, "no consistent step with a live copy") {
		t.Fatalf("event: %v", ev)
	}
}

// TestGangBrokenWhileRecovering: the ranks still alive get a clear error
// from their next call while their job is recovered, and save again once
// it is.
func TestGangBrokenWhileRecovering(t *testing.T) {
	const job, ws = "abort", 2
	cl := rackCluster(t, 1)
	cl.saveStep(job, ws, 1, 0, 1)
	cl.waitLatest(job, 1)
	waitReplicas(t, cl, job, 1, ws, 2)
	// A recovery that cannot finish: node-2, the spare that would take
	// rank 1, dies first, unknown to the coordinator, so rank 1's restore
	// onto it fails and the gang stays broken.
	cl.agents[2].Stop()
	events := cl.watch(job)
	cl.agents[1].Stop()
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1"}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, events); ev.Ok {
		t.Fatalf("recovery onto a dead spare succeeded: %v", ev)
	}
	s, _ := cl.clients[0].Session(job, 0, ws)
	err := s.Save(ctxT(t), 2, []sdk.Tensor{{Name: "w", DType: shm.U8, Shape: []int64{4096}, Data: rankData(2, 0)}}, nil)
	if !errors.Is(err, sdk.ErrGangBroken) || !strings.Contains(err.Error(), "restoring step 1") || !strings.Contains(err.Error(), "node-1 down") {
		t.Fatalf("save by a live rank of a broken gang: %v, want ErrGangBroken naming the step and the node", err)
	}
}

// TestARecoveryWhoseRestoreNodeDiesIsTriedAgain: the spare that a
// recovery places the lost rank on dies during the restore, unknown to
// the coordinator when it planned. That try fails, and the spare's own
// death starts no recovery (it runs none of the job's ranks): the
// recovery is tried again, planned afresh, and the job comes back whole
// on the node left.
func TestARecoveryWhoseRestoreNodeDiesIsTriedAgain(t *testing.T) {
	const job, ws = "retried", 2
	cl := rackCluster(t, 2) // every shard in every node's memory
	cl.saveStep(job, ws, 1, 0, 1)
	cl.waitLatest(job, 1)
	waitReplicas(t, cl, job, 1, ws, 3)
	cl.agents[2].Stop() // the spare dies, not yet declared
	events := cl.watch(job)
	cl.agents[1].Stop()
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1"}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, events); ev.Ok || !strings.Contains(ev.Error, "rank 1") {
		t.Fatalf("recovery onto the dead spare: %v, want a failure restoring rank 1", ev)
	}
	resp, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-2"})
	if err != nil || len(resp.Jobs) != 0 {
		t.Fatalf("node-2 down: %v %v, want no job of its own", resp, err)
	}
	var ev *coordpb.JobEvent
	for ev == nil || !ev.Ok { // tries onto node-2 before its death was declared fail too
		ev = nextEvent(t, events)
	}
	if ev.Step != 1 || ev.Placement[0] != "node-0" || ev.Placement[1] != "node-0" || !strings.Contains(ev.Reason, "retry") {
		t.Fatalf("recovery tried again: %v, want step 1 on node-0 alone, its reason saying it is a retry", ev)
	}
	for rank := range uint32(ws) {
		s, _ := cl.clients[0].Session(job, rank, ws)
		got, err := s.RestoreStep(ctxT(t), 1)
		if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(1, rank)) {
			t.Fatalf("rank %d on node-0 after the retried recovery: %v", rank, err)
		}
	}
}

// TestARecoveryWaitingOnAHungNodeEndsAtItsDeath: the spare a recovery
// places the lost rank on hangs in the restore (its fetch held a minute by
// agent/restore-fetched; a frozen node answers nothing). Once the spare
// is declared down, the call waiting on it ends at once, not after the
// coordinator's two-minute bound on an agent call, and the retried
// recovery brings the job back on the node left.
func TestARecoveryWaitingOnAHungNodeEndsAtItsDeath(t *testing.T) {
	const job, ws = "hung", 2
	in := injector(t, "")
	cl := rackClusterWith(t, 3, func(c *coordinator.Config) { c.Replicas = 2 }, func(i int, cfg *agent.Config) {
		if i == 2 {
			cfg.Faults = in
		}
	})
	cl.saveStep(job, ws, 1, 0, 1)
	cl.waitLatest(job, 1)
	waitReplicas(t, cl, job, 1, ws, 3)
	mustSet(t, in, "agent/restore-fetched=sleep(60000ms)")
	events := cl.watch(job)
	cl.agents[1].Stop()
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1"}); err != nil {
		t.Fatal(err)
	}
	wait.ForNil(t, 20*time.Second, "node-2's restore of rank 1 held", func() error {
		if in.Hits()["agent/restore-fetched"] == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-2", Reason: "hung"}); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events) // within 20 s: the agent call's own bound is 2 min
	if ev.Ok || !strings.Contains(ev.Error, "declared down") {
		t.Fatalf("the try waiting on node-2: %v, want a failure naming its death", ev)
	}
	for ev == nil || !ev.Ok {
		ev = nextEvent(t, events)
	}
	if ev.Step != 1 || ev.Placement[0] != "node-0" || ev.Placement[1] != "node-0" {
		t.Fatalf("recovery tried again: %v, want step 1 on node-0 alone", ev)
	}
}

func waitReplicas(t *testing.T, cl *cluster, job string, step int64, ws uint32, copies int) {
	t.Helper()
	// 20 s: replication runs beside everything else on a 2-core CI machine.
	wait.ForNil(t, 20*time.Second, fmt.Sprintf("%d memory copies of each rank of step %d", copies, step), func() error {
		got := cl.replicaNodes(job, step)
		for r := range ws {
			if len(got[r]) < copies {
				return fmt.Errorf("copies %v", got)
			}
		}
		return nil
	})
}
