package coordinator

import (
	"io"
	"log/slog"
	"testing"

	"rewind.dev/rewind/api/coordpb"
)

// TestReplayGangs: which gang orders an agent whose order stream opens is
// sent again. An abort goes again only while its recovery runs, to a node
// it concerned; a gang order also goes to any agent that holds the job's
// gang broken, which joins the record so that the resume to come reaches
// it too; an order already waiting is not doubled; replays are marked so.
func TestReplayGangs(t *testing.T) {
	abort, resume := coordpb.OrderKind_ORDER_KIND_ABORT, coordpb.OrderKind_ORDER_KIND_RESUME
	for _, tc := range []struct {
		name      string
		kind      coordpb.OrderKind
		failed    bool
		inRecord  bool
		broken    bool
		waiting   bool
		sent      bool
		nodeAdded bool
	}{
		{name: "abort of a running recovery, to a node it concerned", kind: abort, inRecord: true, sent: true},
		{name: "abort, to a node holding the gang broken", kind: abort, broken: true, sent: true, nodeAdded: true},
		{name: "abort, to a node it did not concern", kind: abort},
		{name: "abort of a failed recovery", kind: abort, failed: true, inRecord: true},
		{name: "resume, to a node it concerned", kind: resume, inRecord: true, sent: true},
		{name: "resume, to a node holding the gang broken", kind: resume, broken: true, sent: true, nodeAdded: true},
		{name: "resume, to a node it did not concern", kind: resume},
		{name: "resume already waiting", kind: resume, inRecord: true, waiting: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Coordinator{log: slog.New(slog.NewTextHandler(io.Discard, nil)), streams: newOrderStreams()}
			g := newGangs(c)
			rec := &gangRecord{kind: tc.kind, failed: tc.failed, step: 7, nodes: map[string]bool{"other": true}}
			if tc.inRecord {
				rec.nodes["n"] = true
			}
			g.records["job"] = rec
			if tc.waiting {
				c.streams.send("n", rec.order("job", false))
			}
			broken := map[string]int64{}
			if tc.broken {
				broken["job"] = 5
			}
			g.replay("n", broken)
			var replays int
			for _, od := range c.streams.orders {
				if od.node != "n" {
					t.Fatalf("an order for %s", od.node)
				}
				if od.o.GetAbort().GetReplay() || od.o.GetResume().GetReplay() {
					replays++
					if od.o.Kind() != tc.kind || od.o.Step != 7 || od.o.Job != "job" {
						t.Fatalf("replayed %v, want the record's %s of step 7", od.o, tc.kind)
					}
				}
			}
			if want := map[bool]int{true: 1}[tc.sent]; replays != want {
				t.Fatalf("%d replayed orders, want %d", replays, want)
			}
			if rec.nodes["n"] != (tc.inRecord || tc.nodeAdded) {
				t.Fatalf("node in the record: %v, want %v", rec.nodes["n"], tc.inRecord || tc.nodeAdded)
			}
		})
	}
}
