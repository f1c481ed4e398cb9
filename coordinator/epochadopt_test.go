package coordinator_test

import (
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/testcluster"
)

// TestAJobsNodesBackLateBringTheirEpoch: every node of a job comes back
// after this coordinator caught up with the agents (a rack partitioned
// from a restarted coordinator), their agents told an epoch the index
// does not know. The job's own node is believed then too: were its
// epoch not adopted, the next recovery would raise the epoch to one the
// agents already passed, and fence no rank of the old gang.
func TestAJobsNodesBackLateBringTheirEpoch(t *testing.T) {
	c, clk := startOnFakeClock(t)
	a, b := dialNode(t, c.Addr, "node-a"), dialNode(t, c.Addr, "node-b")
	victimRuns(t, a, b)

	clk.Step(time.Hour) // the coordinator has caught up
	registerNode(t, b, "node-b", []*coordpb.ShardRecord{victimShard("node-b", 1)},
		[]*coordpb.Pin{{Job: victim, Step: 1, Protected: -1, Epoch: 3, EpochStep: 1}})
	wantVictimEpoch(t, b, 3, "node-b, the victim's node, named epoch 3 after the coordinator caught up")
	commitVictim(t, b, 2, 3)
}

// TestARegangedJobsNewNodeBringsItsEpoch: the index is behind (a standby
// took the lead with a stale store): it holds the job at epoch 1 on
// node-a and node-d, with node-d's rank 1 of step 2 committed. The job
// was re-ganged meanwhile at epoch 2 onto node-a and node-n, both of
// whose ranks committed step 2. node-n, which the index knows nothing
// of, registers first: its epoch must be adopted before its inventory
// is applied, or its copy of step 2 joins the stale epoch's step and is
// dropped with it when node-a's record of the new epoch arrives; step 2
// would then never become consistent.
func TestARegangedJobsNewNodeBringsItsEpoch(t *testing.T) {
	c, _ := startOnFakeClock(t) // standing still: the coordinator catches up throughout
	a, d, n := dialNode(t, c.Addr, "node-a"), dialNode(t, c.Addr, "node-d"), dialNode(t, c.Addr, "node-n")
	registerNode(t, a, "node-a", nil, nil)
	registerNode(t, d, "node-d", nil, nil)
	if _, err := testcluster.DialCoordinator(t, c.Addr).RegisterJob(ctxT(t), &coordpb.RegisterJobRequest{Job: victim, WorldSize: 2,
		Placement: map[uint32]string{0: "node-a", 1: "node-d"}, Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	shard := func(node string, rank uint32, step int64, epoch uint64) *coordpb.ShardRecord {
		return &coordpb.ShardRecord{Job: victim, Step: step, Rank: rank, WorldSize: 2, Node: node, SizeBytes: 4096,
			HeaderChecksum: "crc32c:00000000", State: coordpb.CopyState_COPY_STATE_COMMITTED, Epoch: epoch}
	}
	report := func(cl coordpb.CoordinatorClient, rec *coordpb.ShardRecord) {
		t.Helper()
		if _, err := cl.Report(ctxT(t), &coordpb.ReportRequest{Node: rec.Node, Shards: []*coordpb.ShardRecord{rec}}); err != nil {
			t.Fatal(err)
		}
	}
	report(a, shard("node-a", 0, 1, 1))
	report(d, shard("node-d", 1, 1, 1))
	report(d, shard("node-d", 1, 2, 1))

	told := []*coordpb.Pin{{Job: victim, Step: 1, Protected: -1, Epoch: 2, EpochStep: 1}}
	registerNode(t, n, "node-n", []*coordpb.ShardRecord{shard("node-n", 1, 2, 2)}, told)
	registerNode(t, a, "node-a", []*coordpb.ShardRecord{shard("node-a", 0, 1, 1), shard("node-a", 0, 2, 2)}, told)
	l, err := a.Latest(ctxT(t), &coordpb.LatestRequest{Job: victim})
	if err != nil || l.Step != 2 || l.Epoch != 2 {
		t.Fatalf("latest after node-n and node-a registered step 2 of epoch 2: %v %v; want step 2, epoch 2", l, err)
	}
}
