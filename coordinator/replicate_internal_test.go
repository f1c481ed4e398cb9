package coordinator

import (
	"fmt"
	"testing"

	"rewind.dev/rewind/api/coordpb"
)

// TestReplicaOrderedOnce: the scan orders a newly consistent step's
// replicas before the replication of its commit is dequeued (the commit
// queue is drained by another goroutine). The commit must not order the
// same replicas again while they are in flight: the peer would verify
// its copy once more for nothing, and a second order to a peer whose
// copy rotted made it drop the copy before any restore looked (the
// corrupt-replica fallback tests); nor once the peer reported it made,
// before its own report of the copy is in the index. A replica that
// failed is ordered again.
func TestReplicaOrderedOnce(t *testing.T) {
	c, _ := newLeadTestCoordinator(t, nil)
	c.cfg.Replicas = 2
	const job, sum = "once", "sum-1"
	commit := Record{Job: job, Step: 1, Rank: 0, WorldSize: 1, Node: "node-0", Size: 8, Sum: sum, State: CopyCommitted}
	subs := map[string]*subscriber{}
	for i, domain := range []string{"rack-a", "rack-b", "rack-a"} {
		node := fmt.Sprintf("node-%d", i)
		var inv []Record
		if i == 0 {
			inv = []Record{commit}
		}
		if _, err := c.Register(&NodeInfo{Name: node, Addr: node + ":7070", FailureDomain: domain}, inv, nil); err != nil {
			t.Fatal(err)
		}
		subs[node], _ = c.streams.open(node, nil)
	}
	if st := c.state.Jobs[job].Steps[1]; st == nil || st.State != Consistent {
		t.Fatalf("step 1 of %s is not consistent: %+v", job, st)
	}
	taken := func() map[string][]*coordpb.TransferOrder {
		out := map[string][]*coordpb.TransferOrder{}
		for node, s := range subs {
			if o := c.streams.take(node, s); len(o) > 0 {
				out[node] = o
			}
		}
		return out
	}
	rp := c.replication
	rp.scan()
	first := taken()
	if len(first["node-1"]) != 1 || len(first["node-2"]) != 1 || len(first) != 2 {
		t.Fatalf("the scan ordered %v, want one replica on node-1 and one on node-2", first)
	}
	cr := commitRec{job: job, rank: 0, ws: 1, step: 1, node: "node-0", sum: sum, size: 8}
	commitAgain := func() map[string][]*coordpb.TransferOrder {
		rp.mu.Lock()
		rp.replicateCommit(cr)
		rp.mu.Unlock()
		return taken()
	}
	outcome := func(node string, ok bool) {
		o := first[node][0]
		ev := &coordpb.TierEvent{Order: o.Id, Kind: o.Kind(), Job: job, Step: 1, Rank: 0, Ok: ok}
		if !ok {
			ev.Error = "injected"
		}
		rp.outcome(node, ev)
	}
	if again := commitAgain(); len(again) != 0 {
		t.Fatalf("the commit ordered %v again while the scan's orders were in flight", again)
	}

	// node-2 reports its replica made; its shard report, on another
	// stream, is not in the index yet: not ordered again either.
	outcome("node-2", true)
	if again := commitAgain(); len(again) != 0 {
		t.Fatalf("the commit ordered %v again after node-2 made its replica", again)
	}
	// node-1's replica fails: a later commit of the step orders it again,
	// and only it.
	outcome("node-1", false)
	if again := commitAgain(); len(again) != 1 || len(again["node-1"]) != 1 {
		t.Fatalf("after node-1's replica failed the commit ordered %v, want node-1's alone", again)
	}
}
