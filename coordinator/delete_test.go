package coordinator_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/wait"
)

// TestDeleteStepWithACopyOnADownNode: a deletion calls the nodes that hold
// the step in parallel and counts the copies of a node that is down as
// deleted with its memory. The replicas of node-0's and node-1's ranks
// are on node-2, the only node of another failure domain, which is then
// declared down: the count must be every copy, and the live nodes must
// hold the step no more (under the race detector: node-2's copies were
// counted outside the lock the calls to node-0 and node-1 took).
func TestDeleteStepWithACopyOnADownNode(t *testing.T) {
	cl := &cluster{t: t, dataDir: filepath.Join(t.TempDir(), "coord")}
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, "127.0.0.1:0", func(c *coordinator.Config) { c.Replicas = 1 })
	cl.dial()
	for i, domain := range []string{"rack-a", "rack-a", "rack-b"} {
		cl.addAgent(func(cfg *agent.Config) { cfg.Node, cfg.FailureDomain = fmt.Sprintf("node-%d", i), domain })
	}
	cl.waitOrderStreams()
	cl.saveSteps("del", 2, 1, 0, 1)
	wait.ForNil(t, 10*time.Second, "step 1's replicas on node-2", func() error {
		resp, err := cl.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: "del", Step: 1})
		if err != nil {
			return err
		}
		on := map[string]int{}
		for _, cp := range resp.Step.Copies {
			if cp.Tier == "shm" {
				on[cp.Node]++
			}
		}
		if on["node-0"] != 1 || on["node-1"] != 1 || on["node-2"] != 2 {
			return fmt.Errorf("copies in memory by node: %v", on)
		}
		return nil
	})
	cl.saveStep("del", 2, 2, 0, 1) // step 1 is then not the latest
	cl.waitLatest("del", 2)
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-2", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	del, err := cl.api.DeleteStep(ctxT(t), &coordpb.DeleteStepRequest{Job: "del", Step: 1})
	if err != nil || del.CopiesDeleted != 4 {
		t.Fatalf("DeleteStep(del, 1) = %v, %v; want 4 copies deleted (2 on node-2, down)", del, err)
	}
	for i, c := range cl.clients[:2] {
		shards, err := c.List(ctxT(t), "del")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range shards {
			if s.Step == 1 {
				t.Fatalf("node-%d still holds rank %d's step 1 after its deletion", i, s.Rank)
			}
		}
	}
}
