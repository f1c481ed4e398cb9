package coordinator_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// TestStaleWritingSlotKeepsNewWorldSize: a save that died between Prepare
// and Commit leaves its slot "writing" at the job's old world size. After
// an elastic restart registered the job with a new size, the agent holding
// that slot reconnects (here, to a restarted coordinator): the job keeps
// the new size, and the new gang's saves still land.
func TestStaleWritingSlotKeepsNewWorldSize(t *testing.T) {
	cl := newCluster(t, 1)
	ctx := ctxT(t)
	if _, err := cl.agents[0].Agent.Prepare(ctx, "el", 0, 2, 3, shm.Alignment); err != nil {
		t.Fatal(err)
	}
	cl.waitWorldSize("el", 2)
	// The elastic restart: the new gang (4 ranks) registers the job.
	if _, err := cl.api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "el", WorldSize: 4}); err != nil {
		t.Fatal(err)
	}
	// The coordinator restarts on its store: the agent registers again,
	// with the stale slot in its inventory.
	cl.stop()
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, cl.addr)
	// A save of another job is reported after the agent's registration.
	cl.saveStep("probe", 1, 1, 0)
	cl.waitLatest("probe", 1)
	cl.waitWorldSize("el", 4)
	cl.saveStep("el", 4, 5, 0)
	steps, err := cl.api.ListSteps(ctx, &coordpb.ListStepsRequest{Job: "el"})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range steps.Steps {
		if st.Step == 5 && st.WorldSize != 4 {
			t.Fatalf("the new gang's step 5 was recorded at world size %d", st.WorldSize)
		}
	}
}

// waitWorldSize waits until the coordinator has job at world size ws.
func (cl *cluster) waitWorldSize(job string, ws uint32) {
	cl.t.Helper()
	wait.ForNil(cl.t, 10*time.Second, fmt.Sprintf("job %s at world size %d", job, ws), func() error {
		jobs, err := cl.api.ListJobs(ctxT(cl.t), &coordpb.ListJobsRequest{})
		if err != nil {
			return err
		}
		for _, j := range jobs.Jobs {
			if j.Id == job && j.WorldSize != ws {
				return fmt.Errorf("world size %d", j.WorldSize)
			}
			if j.Id == job {
				return nil
			}
		}
		return fmt.Errorf("no job %s", job)
	})
}

// elasticRows is the global tensor of the elastic tests: F32 [12, 4],
// its rows split evenly over the world size (rank r of ws holds rows
// [12r/ws, 12(r+1)/ws)).
const elasticRows, elasticCols = 12, 4

func elasticGlobal(step int64) []byte {
	g := make([]byte, elasticRows*elasticCols*4)
	for i := range g {
		g[i] = byte(int64(i)*5 + step)
	}
	return g
}

func rowsOf(rank, ws uint32) (lo, n int64) {
	lo = elasticRows * int64(rank) / int64(ws)
	return lo, elasticRows*int64(rank+1)/int64(ws) - lo
}

// saveRows saves step for rank of ws on client c: its rows of the global
// tensor, with their chunk record.
func saveRows(t *testing.T, c *sdk.Client, job string, rank, ws uint32, step int64) error {
	t.Helper()
	s, err := c.Session(job, rank, ws)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lo, n := rowsOf(rank, ws)
	const rb = elasticCols * 4
	ts := []sdk.Tensor{{Name: "w", DType: shm.F32, Shape: []int64{n, elasticCols}, Data: elasticGlobal(step)[lo*rb : (lo+n)*rb],
		Chunk: &shm.Chunk{GlobalShape: []int64{elasticRows, elasticCols}, Offsets: []int64{lo, 0}}}}
	return s.Save(ctxT(t), step, ts, map[string]uint32{"rank": rank})
}

// elasticJob saves steps 1 and 2 of job at world size 6, rank r on
// node-(r%3), registered elastic down to minSize, and waits until step 2
// is consistent and in two nodes' memory; then node-1 (ranks 1 and 4)
// dies. It returns the recovery's event.
func elasticJob(t *testing.T, cl *cluster, job string, minSize uint32) *coordpb.JobEvent {
	t.Helper()
	if _, err := cl.api.RegisterJob(ctxT(t), &coordpb.RegisterJobRequest{Job: job, WorldSize: 6, MinWorldSize: &minSize}); err != nil {
		t.Fatal(err)
	}
	for step := int64(1); step <= 2; step++ {
		for r := range uint32(6) {
			if err := saveRows(t, cl.clients[r%3], job, r, 6, step); err != nil {
				t.Fatal(err)
			}
		}
		cl.waitLatest(job, step)
	}
	waitReplicas(t, cl, job, 2, 6, 2)
	events := cl.watch(job)
	cl.agents[1].Stop()
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events)
	if !ev.Ok || ev.Step != 2 {
		t.Fatalf("recovery event: %v", ev)
	}
	return ev
}

// TestElasticRecoveryShrinks: six ranks on three nodes, no spare, elastic
// down to two. node-1 dies: the job restarts at world size 4 on the ranks
// of node-0 and node-2 (old ranks 0, 2, 3 and 5, numbered anew), which
// restore their rows of step 2, saved by six, bit for bit: the rows of
// the dead node's ranks from their replicas. A process of the old gang
// still alive cannot save; the new gang saves step 3 at world size 4,
// and rewind ls says why the world size changed. Once node-1 is back, an
// operator's restart grows the job back to six ranks (growBack).
func TestElasticRecoveryShrinks(t *testing.T) {
	const job = "el-shrink"
	cl := rackCluster(t, 1)
	ev := elasticJob(t, cl, job, 2)
	want := map[uint32]string{0: "node-0", 1: "node-2", 2: "node-0", 3: "node-2"}
	if ev.WorldSize != 4 || ev.PreviousWorldSize != 6 || !maps.Equal(ev.Placement, want) {
		t.Fatalf("elastic recovery event: world size %d (was %d), placement %v; want 4 (was 6) on %v", ev.WorldSize, ev.PreviousWorldSize, ev.Placement, want)
	}
	node := map[string]*sdk.Client{"node-0": cl.clients[0], "node-2": cl.clients[2]}
	reshardAll(t, job, want, node, 2, 6)
	// Old rank 5, on node-2, never restored: its save is refused.
	if err := saveRows(t, cl.clients[2], job, 5, 6, 3); !errors.Is(err, sdk.ErrGangBroken) {
		t.Fatalf("a save by rank 5 of the old gang after the elastic recovery: %v, want gang broken", err)
	}
	for r := range uint32(4) {
		if err := saveRows(t, node[want[r]], job, r, 4, 3); err != nil {
			t.Fatalf("new rank %d of 4 saving step 3: %v", r, err)
		}
	}
	cl.waitLatest(job, 3)
	if j := jobInfo(t, cl, job); j.WorldSize != 4 || j.MinWorldSize != 2 || j.FullWorldSize != 6 || j.WorldSizeReason == "" {
		t.Fatalf("job after the elastic recovery: %v", j)
	}
	droppedRanksFreed(t, cl, job, node)
	growBack(t, cl, job, node)
}

// droppedRanksFreed: once step 3, saved by four, is protected (every
// rank's shard in two nodes' memory), the shards of old ranks 4 and 5 of
// steps 1 and 2 leave the live nodes' memory and the index (no rank of
// those numbers will save again to rotate them out); the copies of
// ranks 0 to 3 of step 2 are left to the usual rotation.
func droppedRanksFreed(t *testing.T, cl *cluster, job string, node map[string]*sdk.Client) {
	t.Helper()
	wait.ForNil(t, 20*time.Second, "step 3 protected and the dropped ranks' shards freed", func() error {
		if j := jobInfo(t, cl, job); j.Protected != 3 {
			return fmt.Errorf("protected step %d", j.Protected)
		}
		for step := int64(1); step <= 2; step++ {
			for r, nodes := range cl.replicaNodes(job, step) {
				// node-1 is down: its copies stay in the index, for if
				// it comes back with its memory.
				if live := slices.DeleteFunc(nodes, func(n string) bool { return n == "node-1" }); r >= 4 && len(live) > 0 {
					return fmt.Errorf("step %d: rank %d still in the memory of %v", step, r, live)
				}
			}
		}
		for name, c := range node {
			shards, err := c.List(ctxT(t), job)
			if err != nil {
				return err
			}
			for _, sh := range shards {
				if sh.Rank >= 4 {
					return fmt.Errorf("%s still holds rank %d of step %d", name, sh.Rank, sh.Step)
				}
			}
		}
		return nil
	})
	// Which copies of ranks 0 to 3 the usual rotation leaves depends on
	// where the new ranks' slots took their turns: TestDroppedCopies
	// holds the freeing to ranks 4 and 5 exactly.
	if kept := cl.replicaNodes(job, 2); len(kept) == 0 {
		t.Fatalf("every copy of step 2 was deleted: %v", kept)
	}
}

// growBack brings node-1 back (a fresh agent, its memory empty) and
// restarts the shrunk job at its latest step, saved by four: the job
// grows back to six ranks, two of them on node-1, whose numbers the step
// does not have, and which restore by reading the others' shards; all
// six save the next step.
func growBack(t *testing.T, cl *cluster, job string, node map[string]*sdk.Client) {
	t.Helper()
	cl.addAgent(func(cfg *agent.Config) { cfg.Node, cfg.FailureDomain = "node-1", "rack-b" })
	node["node-1"] = cl.clients[len(cl.clients)-1]
	wait.ForNil(t, 10*time.Second, "node-1's order stream open again", func() error {
		resp, err := cl.api.TierStatus(ctxT(t), &coordpb.TierStatusRequest{})
		if err != nil {
			return err
		}
		for _, n := range resp.Nodes {
			if n.Node == "node-1" {
				return nil
			}
		}
		return fmt.Errorf("nodes %v", resp.Nodes)
	})
	full := map[uint32]string{0: "node-0", 1: "node-2", 2: "node-0", 3: "node-2", 4: "node-1", 5: "node-1"}
	events := cl.watch(job)
	plan, err := cl.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, Restart: true, RequestedBy: "test"})
	if err != nil || !plan.Restarted || plan.Step != 3 {
		t.Fatalf("restart at the full size: %v %v", plan, err)
	}
	if ev := nextEvent(t, events); !ev.Ok || ev.WorldSize != 6 || ev.PreviousWorldSize != 4 || ev.Step != 3 || !maps.Equal(ev.Placement, full) {
		t.Fatalf("restart event: %v; want 6 ranks (was 4) on %v", ev, full)
	}
	reshardAll(t, job, full, node, 3, 4)
	for r := range uint32(6) {
		if err := saveRows(t, node[full[r]], job, r, 6, 4); err != nil {
			t.Fatalf("rank %d of 6 saving step 4 after growing back: %v", r, err)
		}
	}
	cl.waitLatest(job, 4)
	if j := jobInfo(t, cl, job); j.WorldSize != 6 || j.WorldSizeReason != "" {
		t.Fatalf("job grown back: %v", j)
	}
}

func jobInfo(t *testing.T, cl *cluster, job string) *coordpb.Job {
	t.Helper()
	jobs, err := cl.api.ListJobs(ctxT(t), &coordpb.ListJobsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs.Jobs {
		if j.Id == job {
			return j
		}
	}
	t.Fatalf("no job %s", job)
	return nil
}

// TestElasticBelowMinimumDoublesUp: the same loss with a minimum of 5:
// four ranks would be too few, so the lost ranks double up on the live
// nodes and the world size stays 6.
func TestElasticBelowMinimumDoublesUp(t *testing.T) {
	cl := rackCluster(t, 1)
	ev := elasticJob(t, cl, "el-min", 5)
	if ev.WorldSize != 6 || ev.PreviousWorldSize != 0 || len(ev.Placement) != 6 {
		t.Fatalf("recovery event: world size %d (was %d) on %v; want 6 ranks, unchanged", ev.WorldSize, ev.PreviousWorldSize, ev.Placement)
	}
}

// TestElasticJobTakesASpareFirst: an elastic job whose lost node a spare
// can replace keeps its world size: the spare takes the lost rank.
func TestElasticJobTakesASpareFirst(t *testing.T) {
	const job = "el-spare"
	cl := rackCluster(t, 1)
	one := uint32(1)
	if _, err := cl.api.RegisterJob(ctxT(t), &coordpb.RegisterJobRequest{Job: job, WorldSize: 2, MinWorldSize: &one}); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, cl.loseNode1(job, 2))
	if !ev.Ok || ev.WorldSize != 2 || ev.PreviousWorldSize != 0 || ev.Placement[1] != "node-2" {
		t.Fatalf("recovery event: %v; want rank 1 on the spare node-2, world size 2", ev)
	}
}

// TestElasticSettingChecksAndSurvivesRestart: a minimum above the world
// size is refused and changes nothing; a good one is kept across a
// coordinator restart.
func TestElasticSettingChecksAndSurvivesRestart(t *testing.T) {
	cl := newCluster(t, 1)
	ctx := ctxT(t)
	nine, three := uint32(9), uint32(3)
	_, err := cl.api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "el-set", WorldSize: 8, MinWorldSize: &nine})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("minimum 9 of 8 ranks: %v, want InvalidArgument", err)
	}
	if _, err := cl.api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "el-set", WorldSize: 8, MinWorldSize: &three}); err != nil {
		t.Fatal(err)
	}
	cl.stop()
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, cl.addr)
	cl.dial()
	wait.ForNil(t, 10*time.Second, "the elastic setting after a restart", func() error {
		jobs, err := cl.api.ListJobs(ctxT(t), &coordpb.ListJobsRequest{})
		if err != nil {
			return err
		}
		for _, j := range jobs.Jobs {
			if j.Id == "el-set" && j.MinWorldSize == 3 && j.FullWorldSize == 8 {
				return nil
			}
		}
		return fmt.Errorf("jobs %v", jobs.Jobs)
	})
}

// reshardAll has every rank of a gang placed on placement (on the nodes'
// clients) restore its rows of job's latest step, which must be step,
// saved at world size saved, and checks that together they restored the
// global tensor of that step bit for bit.
func reshardAll(t *testing.T, job string, placement map[uint32]string, node map[string]*sdk.Client, step int64, saved uint32) {
	t.Helper()
	ws := uint32(len(placement))
	got := make([]byte, elasticRows*elasticCols*4)
	const rb = elasticCols * 4
	for r := range ws {
		s, err := node[placement[r]].Session(job, r, ws)
		if err != nil {
			t.Fatal(err)
		}
		lo, n := rowsOf(r, ws)
		sl := sdk.Slice{Name: "w", DType: shm.F32, Offsets: []int64{lo, 0}, Lengths: []int64{n, elasticCols}, Data: got[lo*rb : (lo+n)*rb]}
		res, err := reshardRetrying(t, s, sl)
		if err != nil || res.Step != step || res.SavedWorldSize != saved {
			t.Fatalf("rank %d of %d resharding step %d saved by %d: %+v %v", r, ws, step, saved, res, err)
		}
	}
	if !bytes.Equal(got, elasticGlobal(step)) {
		t.Fatalf("the tensor %d ranks restored differs from the one %d saved at step %d", ws, saved, step)
	}
}

// reshardRetrying restores sl with s and closes s. A rank started as the
// re-gang's event arrives may find its agent not resumed yet (gang
// broken): it is tried again, as a driver restarts such a rank.
func reshardRetrying(t *testing.T, s *sdk.Session, sl sdk.Slice) (*sdk.Resharded, error) {
	t.Helper()
	defer s.Close()
	var res *sdk.Resharded
	var err error
	_ = wait.Until(10*time.Second, func() error {
		res, err = s.RestoreInto(ctxT(t), sdk.Layout{Slices: []sdk.Slice{sl}})
		if errors.Is(err, sdk.ErrGangBroken) {
			return err // not resumed yet: asked again
		}
		return nil
	})
	return res, err
}
