package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
)

// TestFaultResumeLostWithItsStream: the resume that ends a recovery is
// lost on an agent's order stream (the stream breaks after the
// coordinator took the order). The coordinator sends it again when the
// agent's stream reconnects: every rank of the new gang, once restored, is
// answered again and saves, and the job's next step becomes consistent.
func TestFaultResumeLostWithItsStream(t *testing.T) {
	const job, ws = "lostresume", 2
	in := injector(t, faultinject.CoordResumeSent+"=1*error(ECONNRESET)")
	cl := rackClusterWith(t, 3, func(c *coordinator.Config) { c.Replicas, c.Faults = 1, in }, nil)
	ev := nextEvent(t, cl.loseNode1(job, ws))
	if !ev.Ok || ev.Step != 1 {
		t.Fatalf("recovery: %v", ev)
	}
	if n := in.Hits()[faultinject.CoordResumeSent]; n != 1 {
		t.Fatalf("the resume fault fired %d times, want 1", n)
	}
	cl.ranksSaveOn(job, ws, ev)

	// node-0's agent restarts: its new order stream gets the job's last
	// gang order, the resume of step 1, again. Its gang is not broken, so
	// the resume discards nothing (step 2 is not a step "since the abort").
	cfg := cl.agents[0].Config
	cl.agents[0].Stop()
	var logs testcluster.Logs
	cfg.Logger = logs.Logger(slog.LevelDebug)
	cl.agents[0] = startAgent(t, cfg)
	wait.For(t, 10*time.Second, "node-0 to take the resume sent again on its new order stream", func() bool {
		return logs.Has("resume sent again")
	})
	held := false
	for _, sh := range cl.agents[0].Agent.List(job) {
		held = held || sh.Rank == 0 && sh.Step == 2 && sh.State == "committed"
	}
	if !held {
		t.Fatal("node-0 lost rank 0's step 2 when the resume of step 1 was sent again")
	}
	cl.waitLatest(job, 2)
}

// TestRecoveryLeftUnfinishedIsFinished: a recovery fails after its abort
// (fault coordinator/before-regang; no retry), and the coordinator
// restarts with no memory of it. The aborted agents name the gang they hold broken when
// they reconnect, and the new coordinator finishes the recovery: the
// job's watchers get the re-gang, and its ranks save on.
func TestRecoveryLeftUnfinishedIsFinished(t *testing.T) {
	const job, ws = "unfinished", 2
	in := injector(t, faultinject.CoordBeforeRegang+"=error(EIO)")
	cl := rackClusterWith(t, 3, func(c *coordinator.Config) { c.Replicas, c.Faults, c.RecoveryRetries = 1, in, 0 }, nil)
	if ev := nextEvent(t, cl.loseNode1(job, ws)); ev.Ok {
		t.Fatalf("recovery cut before its re-gang succeeded: %v", ev)
	}
	s, _ := cl.clients[0].Session(job, 0, ws)
	if _, _, err := s.LatestConsistent(ctxT(t)); !errors.Is(err, sdk.ErrGangBroken) {
		t.Fatalf("rank 0 after the failed recovery: %v, want its gang broken", err)
	}

	// LeaveGrace stays the default: past it, a placed node whose agent's
	// order stream is not back is declared down, and through the
	// coordinator's outage that stream's reconnect backoff doubles up to
	// 5 s. A node that is back does not wait for the grace.
	cl.stop()
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, cl.addr, func(c *coordinator.Config) { c.Replicas = 1 })
	ev, err := cl.lastEvent(job)
	if err != nil || !ev.Ok || ev.Kind != coordpb.JobEventKind_JOB_EVENT_KIND_REGANG || ev.Step != 1 || ev.Placement[1] != "node-2" {
		t.Fatalf("the restarted coordinator's event: %v %v; want the re-gang at step 1 with rank 1 on node-2", ev, err)
	}
	cl.ranksSaveOn(job, ws, ev)
}

// ranksSaveOn checks that the ranks of a re-ganged job, restarted where
// ev places them, restore its step, are answered and save the next one,
// which becomes consistent.
func (cl *cluster) ranksSaveOn(job string, ws uint32, ev *coordpb.JobEvent) {
	t := cl.t
	t.Helper()
	for rank, node := range ev.Placement {
		var i int
		if _, err := fmt.Sscanf(node, "node-%d", &i); err != nil {
			t.Fatal(err)
		}
		s, err := cl.clients[i].Session(job, rank, ws)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.RestoreStep(ctxT(t), ev.Step); err != nil {
			t.Fatalf("rank %d on %s: restore: %v", rank, node, err)
		}
		wait.ForNil(t, 10*time.Second, fmt.Sprintf("rank %d on %s answered after the recovery", rank, node), func() error {
			_, _, err := s.LatestConsistent(ctxT(t))
			return err
		})
		if err := s.Save(ctxT(t), ev.Step+1, u8(rankData(ev.Step+1, rank)), nil); err != nil {
			t.Fatalf("rank %d on %s: save after the recovery: %v", rank, node, err)
		}
	}
	cl.waitLatest(job, ev.Step+1)
}

// TestNodeLostWhileNoCoordinatorRanIsRecovered: a node running a rank dies
// while the coordinator is down. The new coordinator's failure detection
// never knew it, so it never declares it dead; but it is placed on and its
// agent does not come back, so once the grace has passed it is declared
// down and its job recovered.
func TestNodeLostWhileNoCoordinatorRanIsRecovered(t *testing.T) {
	const job, ws = "absent", 2
	cl, seed := gossipCoordinator(t, nil)
	for i := range 3 {
		cl.addAgent(func(cfg *agent.Config) {
			g := testcluster.GossipConfig(nil)
			cfg.Node, cfg.FailureDomain = fmt.Sprintf("node-%d", i), []string{"rack-a", "rack-b"}[i%2]
			cfg.Gossip, cfg.GossipJoin = &g, []string{seed}
		})
	}
	cl.saveStep(job, ws, 1, 0, 1)
	cl.waitLatest(job, 1)
	waitReplicas(t, cl, job, 1, ws, 2)
	cl.stop()
	cl.agents[1].Stop()
	g := testcluster.GossipConfig(nil)
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, cl.addr, func(c *coordinator.Config) {
		c.Gossip, c.Replicas, c.LeaveGrace = &g, 1, time.Second
	})
	ev, err := cl.lastEvent(job)
	if err != nil || !ev.Ok || ev.Step != 1 || ev.Placement[1] != "node-2" || !strings.Contains(ev.Reason, "has not connected since the coordinator began to lead") {
		t.Fatalf("the restarted coordinator's event: %v %v; want node-1's rank recovered onto node-2 at step 1", ev, err)
	}
	cl.ranksSaveOn(job, ws, ev)
}

// lastEvent waits for the job's next event, or its last one, from a
// coordinator that may still be starting.
func (cl *cluster) lastEvent(job string) (*coordpb.JobEvent, error) {
	var stream coordpb.Coordinator_WatchJobClient
	wait.For(cl.t, 10*time.Second, "a watch on the coordinator", func() bool {
		var err error
		stream, err = cl.api.WatchJob(ctxT(cl.t), &coordpb.WatchJobRequest{Job: job, Replay: true})
		return err == nil
	})
	return stream.Recv()
}

// TestStaleBrokenGangIsResumedNotRestarted: the agents hold a job's gang
// broken from a recovery that failed (at step 1), but the job trained on
// since (its ranks restored step 1, saved step 2, consistent). A restarted
// coordinator, told of the broken gang, must not take the job back to
// step 1: it tells the agents to resume, and step 2 stays.
func TestStaleBrokenGangIsResumedNotRestarted(t *testing.T) {
	const job, ws = "stale", 2
	in := injector(t, faultinject.CoordBeforeRegang+"=error(EIO)")
	cl := rackClusterWith(t, 3, func(c *coordinator.Config) { c.Replicas, c.Faults, c.RecoveryRetries = 1, in, 0 }, nil)
	if ev := nextEvent(t, cl.loseNode1(job, ws)); ev.Ok {
		t.Fatalf("recovery cut before its re-gang succeeded: %v", ev)
	}
	placement := map[uint32]int{0: 0, 1: 2}
	for rank, i := range placement {
		s, _ := cl.clients[i].Session(job, rank, ws)
		if _, err := s.RestoreStep(ctxT(t), 1); err != nil {
			t.Fatal(err)
		}
		if err := s.Save(ctxT(t), 2, u8(rankData(2, rank)), nil); err != nil {
			t.Fatalf("rank %d, restored, saves step 2: %v", rank, err)
		}
	}
	cl.waitLatest(job, 2)

	cl.stop()
	var logs testcluster.Logs
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, cl.addr, func(c *coordinator.Config) {
		c.Replicas, c.LeaveGrace, c.Logger = 1, time.Second, logs.Logger(slog.LevelInfo)
	})
	wait.For(t, 10*time.Second, "the restarted coordinator to tell the agents the job resumes", func() bool {
		return logs.Has("it is told to resume")
	})
	for rank, i := range placement {
		s, _ := cl.clients[i].Session(job, rank, ws)
		wait.ForNil(t, 10*time.Second, fmt.Sprintf("rank %d after the restart at step 2, its gang not broken", rank), func() error {
			step, _, err := s.LatestConsistent(ctxT(t))
			if err == nil && step != 2 {
				err = fmt.Errorf("step %d", step)
			}
			return err
		})
	}
	// Past the grace (1 s from the restart), a node still absent would be
	// declared down and the job restarted: none is, and step 2 stays.
	wait.Holds(t, 1500*time.Millisecond, "step 2 as the latest consistent step", func() error {
		l, err := cl.api.Latest(ctxT(t), &coordpb.LatestRequest{Job: job})
		if err == nil && l.Step != 2 {
			err = fmt.Errorf("latest consistent step %d", l.Step)
		}
		return err
	})
	ctx, cancel := context.WithTimeout(ctxT(t), time.Second)
	defer cancel()
	stream, err := cl.api.WatchJob(ctx, &coordpb.WatchJobRequest{Job: job, Replay: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := stream.Recv(); err == nil {
		t.Fatalf("the restarted coordinator published %v; want no event", ev)
	}
}
