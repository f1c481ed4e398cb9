package coordinator

import (
	"slices"
	"testing"

	"rewind.dev/rewind/api/coordpb"
)

// TestClaimLost: an order is lost, and its part told so, when the stream
// it was sent on ends unreported, and also when it was queued for a node
// and never sent: its stream ended before taking it, or the node has none
// (declared down). Without the second, a replica or tier copy ordered
// from a node in the instant its agent died waited for good, and with it
// every later replica and tier copy of the job. Orders queued while a
// newer stream is open are that stream's to send.
func TestClaimLost(t *testing.T) {
	q := newOrderStreams()
	repl := func(job string) *coordpb.TransferOrder {
		return replicateOrder(job, 1, &coordpb.ReplicateOrder{Rank: 0, WorldSize: 1})
	}
	ids := func(ods []*order) (out []string) {
		for _, od := range ods {
			out = append(out, od.o.Job)
		}
		return out
	}
	kind := coordpb.OrderKind_ORDER_KIND_REPLICATE

	// Sent on a stream that ended unreported.
	s, _ := q.open("node-1", nil)
	q.send("node-1", repl("sent"))
	q.take("node-1", s)
	// Queued as the stream was ending: never taken.
	q.send("node-1", repl("queued"))
	if !q.close("node-1", s) {
		t.Fatal("the stream did not end")
	}
	if got := ids(q.claimLost("node-1", s, kind)); !slices.Equal(got, []string{"sent", "queued"}) {
		t.Fatalf("node-1 lost %v, want the sent order and the queued one", got)
	}

	// Queued for a node with no stream, then declared down.
	if q.send("node-2", repl("down")) {
		t.Fatal("node-2 has no stream, yet send says it is connected")
	}
	if got := ids(q.claimLost("node-2", nil, coordpb.OrderKind_ORDER_KIND_PUSH)); len(got) != 0 {
		t.Fatalf("a push claim took %v, a replicate order", got)
	}
	if got := ids(q.claimLost("node-2", nil, kind)); !slices.Equal(got, []string{"down"}) {
		t.Fatalf("node-2 lost %v, want the order queued for it", got)
	}

	// A newer stream replaced the old one: what is queued is its to send.
	old, _ := q.open("node-3", nil)
	q.send("node-3", repl("for the new stream"))
	cur, replaced := q.open("node-3", nil)
	if replaced != old {
		t.Fatal("the new stream did not replace the old")
	}
	if got := q.claimLost("node-3", old, kind); len(got) != 0 {
		t.Fatalf("the old stream's end took %v from the new stream", ids(got))
	}
	if got := q.take("node-3", cur); len(got) != 1 {
		t.Fatalf("the new stream took %d orders, want 1", len(got))
	}
}
