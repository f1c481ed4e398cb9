package coordinator_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/shm"
)

// replicaNodes returns, per rank of step, the nodes holding it in memory.
func (cl *cluster) replicaNodes(job string, step int64) map[uint32][]string {
	cl.t.Helper()
	st, err := cl.api.InspectStep(ctxT(cl.t), &coordpb.InspectStepRequest{Job: job, Step: step})
	if err != nil {
		cl.t.Fatal(err)
	}
	out := map[uint32][]string{}
	for _, c := range st.Step.Copies {
		if c.Tier == "shm" {
			out[c.Rank] = append(out[c.Rank], c.Node)
		}
	}
	return out
}

// TestPeerReplication: each rank's shard of a consistent step is copied to
// one peer, in another failure domain when there is one, always the same
// peer; a node that lost its memory gets its shard back from the peer,
// bit-identical.
func TestPeerReplication(t *testing.T) {
	const job, ws = "repl", 3
	cl := rackCluster(t, 1)
	// node-0 and node-2 (rack-a) replicate to node-1, the only node of
	// rack-b; node-1 to the next node after it, node-2.
	want := map[uint32]string{0: "node-1", 1: "node-2", 2: "node-1"}
	for step := int64(1); step <= 3; step++ {
		cl.saveStep(job, ws, step, 0, 1, 2)
		cl.waitLatest(job, step)
		wait.ForNil(t, 10*time.Second, fmt.Sprintf("step %d's ranks copied also to %v", step, want), func() error {
			got := cl.replicaNodes(job, step)
			for r := range uint32(ws) {
				if nodes := got[r]; len(nodes) != 2 || nodes[0] != want[r] && nodes[1] != want[r] {
					return fmt.Errorf("memory copies %v", got)
				}
			}
			return nil
		})
	}
	// node-1 loses its memory; its rank comes back from node-2's replica.
	cl.agents[1].Stop()
	cfg := testcluster.AgentConfig(t)
	cfg.Node, cfg.Logger = "node-1", slog.New(slog.NewTextHandler(io.Discard, nil))
	r := testcluster.StartAgent(t, cfg)
	src := cl.agents[2]
	n, err := r.Agent.CopyFromPeer(ctxT(t), agent.PeerShard{Job: job, Rank: 1, WorldSize: ws, Step: 3,
		Size: sizeOf(t, cl, job, 3, 1), HeaderSum: sumOf(t, cl, job, 3, 1), Node: "node-2", Addr: src.Addrs.TCP}, nil)
	if err != nil || n == 0 {
		t.Fatalf("copy of rank 1 from node-2's replica: %d %v", n, err)
	}
	c := testcluster.Dial(t, cfg.Socket)
	s, _ := c.Session(job, 1, ws)
	got, err := s.RestoreStep(ctxT(t), 3)
	if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(3, 1)) {
		t.Fatalf("rank 1 from the peer's memory: %v", err)
	}
}

func copyOf(t *testing.T, cl *cluster, job string, step int64, rank uint32) *coordpb.Copy {
	st, err := cl.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: step})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range st.Step.Copies {
		if c.Rank == rank {
			return c
		}
	}
	t.Fatalf("no copy of %s step %d rank %d", job, step, rank)
	return nil
}

func sizeOf(t *testing.T, cl *cluster, job string, step int64, rank uint32) int64 {
	return int64(copyOf(t, cl, job, step, rank).SizeBytes)
}

func sumOf(t *testing.T, cl *cluster, job string, step int64, rank uint32) string {
	return copyOf(t, cl, job, step, rank).HeaderChecksum
}

// TestRestorePlanOrder: a rank's sources go from its own memory to a
// peer's in its failure domain, a peer's elsewhere, then the tiers.
func TestRestorePlanOrder(t *testing.T) {
	const job, ws = "order", 1
	cl := rackCluster(t, 2)
	cl.saveStep(job, ws, 1, 0)
	cl.waitLatest(job, 1)
	waitReplicas(t, cl, job, 1, ws, 3)
	plan, err := cl.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: 1, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range plan.Ranks[0].Sources {
		got = append(got, s.Node)
	}
	if want := []string{"node-0", "node-2", "node-1"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sources of rank 0 (on node-0, rack-a): %v, want %v", got, want)
	}
}

// TestRestoreFallsBackFromACorruptReplica: a node loses its memory; the
// restore takes its rank from the nearest peer, finds that replica
// corrupt, and falls back to the next peer, bit-identical.
func TestRestoreFallsBackFromACorruptReplica(t *testing.T) {
	const job, ws = "fallback", 1
	cl := rackCluster(t, 2)
	cl.saveStep(job, ws, 1, 0)
	cl.waitLatest(job, 1)
	waitReplicas(t, cl, job, 1, ws, 3)
	// node-2 is node-0's nearest peer (same rack): once its background
	// verification has passed, flip a byte of its replica.
	var shards []*agentpb.Shard
	wait.ForNil(t, 10*time.Second, "node-2's replica, verified", func() error {
		var err error
		shards, err = cl.clients[2].List(ctxT(t), job)
		if err == nil && (len(shards) != 1 || !shards[0].Verified) {
			err = fmt.Errorf("shards %v", shards)
		}
		return err
	})
	testcluster.Flip(t, shards[0].Path, -10)
	cl.loseNode0(job, ws)
	cl.restoreFallsBackToNode1(job, ws)
}

// restoreFallsBackToNode1 restores job's step 1 onto the new node-0
// (loseNode0): rank 0 must come from node-1's replica after node-2's
// corrupt one failed, and read back bit-identical.
func (cl *cluster) restoreFallsBackToNode1(job string, ws uint32) {
	t := cl.t
	t.Helper()
	plan, err := cl.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, RequestedBy: "test"})
	if err != nil || !plan.Executed || !plan.Ok {
		t.Fatalf("restore: %v %v", plan, err)
	}
	rp := plan.Ranks[0]
	if rp.Used != "shm:node-1" || len(rp.Failed) != 1 || !strings.Contains(rp.Failed[0], "shm:node-2") || !strings.Contains(rp.Failed[0], "corrupt") {
		t.Fatalf("rank 0 restored from %q after %q, want node-1 after node-2's corrupt replica", rp.Used, rp.Failed)
	}
	s, _ := cl.clients[len(cl.clients)-1].Session(job, 0, ws)
	got, err := s.RestoreStep(ctxT(t), 1)
	if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(1, 0)) {
		t.Fatalf("rank 0 after the fallback: %v", err)
	}
}

// loseNode0 stops node-0's agent, whose memory holds rank 0's own copy of
// job's step 1, and starts an empty one in its place (the last of
// cl.agents and cl.clients), for a restore to fall back from a corrupt
// replica. No replicas are made from then on: the coordinator would heal
// the lost copy from the corrupt replica, find it corrupt there and drop
// it, or put one on the new node-0, before the restore the test is
// about. It returns once the new agent is registered at its new address
// (the restore stages onto it) and the old copy is out of the index (the
// old agent's leaving alone drops it before the new one registers).
func (cl *cluster) loseNode0(job string, ws uint32) {
	t := cl.t
	t.Helper()
	zero := uint32(0)
	if _, err := cl.api.RegisterJob(ctxT(t), &coordpb.RegisterJobRequest{Job: job, WorldSize: ws, Replicas: &zero}); err != nil {
		t.Fatal(err)
	}
	cl.agents[0].Stop()
	cl.addAgent(func(cfg *agent.Config) { cfg.Node, cfg.FailureDomain = "node-0", "rack-a" })
	addr := cl.agents[len(cl.agents)-1].Config.AdvertiseAddr
	wait.ForNil(t, 10*time.Second, "the new node-0 registered: its old copy out of the index", func() error {
		nodes, err := cl.api.Nodes(ctxT(t), &coordpb.NodesRequest{Names: []string{"node-0"}})
		if err != nil || len(nodes.Nodes) != 1 || nodes.Nodes[0].Addr != addr {
			return fmt.Errorf("node-0 at %v (%v), want %s", nodes.GetNodes(), err, addr)
		}
		if got := cl.replicaNodes(job, 1); len(got[0]) != 2 || slices.Contains(got[0], "node-0") {
			return fmt.Errorf("copies %v", got)
		}
		return nil
	})
}

// TestReplicasGiveWayToSaves: node-0's budget fits four segments. Rank 1
// (on node-1) saves first, and its replicas fill three of them on node-0;
// then rank 0 saves on node-0 and needs two: the replicas give way (never
// the newest one), and no save of the node's own fails for a replica's
// sake. Rank 1 has three slots (and node-1 room for them beside rank 0's
// replicas): with no step consistent yet, an agent keeps every step of
// its rank (any may be the one the job makes consistent), so two would
// not take three steps ahead of rank 0.
func TestReplicasGiveWayToSaves(t *testing.T) {
	const job, ws = "budget", 2
	l, err := shm.NewLayout(shm.ShardMeta{Job: job, Rank: 0, WorldSize: ws, Step: 1},
		[]shm.TensorSpec{{Name: "w", DType: shm.U8, Shape: []int64{4096}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := &cluster{t: t, dataDir: t.TempDir()}
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, "127.0.0.1:0", func(c *coordinator.Config) { c.Replicas = 1 })
	cl.dial()
	for i, d := range []string{"rack-a", "rack-b"} {
		cl.addAgent(func(cfg *agent.Config) {
			cfg.Node, cfg.FailureDomain, cfg.BudgetBytes, cfg.SlotsPerRank = fmt.Sprintf("node-%d", i), d, uint64(int64(4+4*i)*l.Size), 2+i
		})
	}
	for step := int64(1); step <= 3; step++ {
		cl.saveStep(job, ws, step, 1)
		wait.ForNil(t, 10*time.Second, fmt.Sprintf("a replica of rank 1 step %d on node-0", step), func() error {
			st, err := cl.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: step})
			if err == nil && len(st.Step.Copies) != 2 { // rank 1 on node-1 and its replica
				err = fmt.Errorf("step %v", st)
			}
			return err
		})
	}
	st, err := cl.clients[0].Status(ctxT(t))
	if err != nil || st.UsedBytes < uint64(3*l.Size) {
		t.Fatalf("node-0 holds %d bytes of replicas, want three segments (%d): %v", st.GetUsedBytes(), 3*l.Size, err)
	}
	for step := int64(1); step <= 3; step++ {
		cl.saveStep(job, ws, step, 0) // fails the test on any save error
		// Rank 0's replica on node-1 before its next save: until it is
		// there, step-1's copies are what memory keeps through a node's
		// loss (the job's protected step), pinned on node-0 beside the
		// latest, and a budget of four segments then holds nothing a
		// save may take (the save refused, rightly). The test is about
		// replicas giving way, not about that race.
		wait.ForNil(t, 10*time.Second, fmt.Sprintf("a replica of rank 0 step %d on node-1", step), func() error {
			st, err := cl.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: step})
			if err != nil {
				return err
			}
			n := 0
			for _, c := range st.Step.Copies {
				if c.Rank == 0 && c.State == coordpb.CopyState_COPY_STATE_COMMITTED {
					n++
				}
			}
			if n != 2 {
				return fmt.Errorf("rank 0 has %d copies of step %d", n, step)
			}
			return nil
		})
	}
	cl.waitLatest(job, 3)
	if got := cl.replicaNodes(job, 3)[1]; len(got) != 2 {
		t.Fatalf("rank 1's newest replica gave way: copies of step 3 on %v", got)
	}
}
