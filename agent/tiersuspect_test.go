package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// TestCorruptTierCopiesReportedOnce: reads that find a tier copy's shard
// corrupt queue one report per copy and shard however many of its leaves
// fail; a copy that cannot be read (missing, a store down) or one in a
// peer's memory, or in another node's on a node-local tier, is not
// reported (that node reports its own); a report the full queue has no
// room for is forgotten, so a later read reports it again.
func TestCorruptTierCopiesReportedOnce(t *testing.T) {
	a := newSuspectAgent(clock.Real)
	ps := PeerShard{Job: "j", Rank: 1, Step: 4, HeaderSum: "h"}
	pfs, s3 := Source{Tier: "pfs", Node: "-"}, Source{Tier: "s3", Node: "-"}
	corrupt := fmt.Errorf("%w: tensor leaf does not match its hash", shm.ErrCorrupt)
	for range 100 {
		a.suspectTier(ps, pfs, corrupt)
	}
	a.suspectTier(ps, s3, fmt.Errorf("reading: %w", tiers.ErrNotExist))
	a.suspectTier(ps, s3, fmt.Errorf("dial tcp: connection refused"))
	a.suspectTier(ps, Source{Tier: "shm", Node: "n1", Addr: "x"}, corrupt)
	a.suspectTier(ps, Source{Tier: "nvme", Node: "n1", Addr: "x"}, corrupt)
	if n := len(a.rep.suspects.queue); n != 1 {
		t.Fatalf("%d reports queued, want 1 (pfs's)", n)
	}
	if req := <-a.rep.suspects.queue; req.Tier != "pfs" || req.Rank != 1 || req.Node != "n0" || req.HeaderChecksum != "h" {
		t.Fatalf("report %v", req)
	}
	a.suspectTier(ps, Source{Tier: "nvme", Node: "n0"}, corrupt)
	if req := <-a.rep.suspects.queue; req.Tier != "nvme" || req.Node != "n0" {
		t.Fatalf("report of this node's own NVMe copy %v", req)
	}
	for i := range maxSuspectQueue + 1 {
		a.suspectTier(PeerShard{Job: "j", Rank: uint32(10 + i), Step: 4}, s3, corrupt)
	}
	if n := len(a.rep.suspects.queue); n != maxSuspectQueue {
		t.Fatalf("%d reports queued, want %d", n, maxSuspectQueue)
	}
	<-a.rep.suspects.queue
	last := PeerShard{Job: "j", Rank: uint32(10 + maxSuspectQueue), Step: 4}
	a.suspectTier(last, s3, corrupt)
	if n := len(a.rep.suspects.queue); n != maxSuspectQueue {
		t.Fatalf("%d reports queued after the one dropped was found again, want %d", n, maxSuspectQueue)
	}
}

// newSuspectAgent is an agent named n0 with only what reports of corrupt
// tier copies need, on clk.
func newSuspectAgent(clk clock.Clock) *Agent {
	a := &Agent{cfg: Config{Node: "n0", Clock: clk}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a.rep = &reporter{a: a, suspects: newSuspects()}
	return a
}

// answeringCoordinator answers every SuspectTierCopy with answer, or err.
type answeringCoordinator struct {
	coordpb.CoordinatorClient
	answer coordpb.SuspectAnswer
	err    error
	calls  atomic.Int32
}

func (c *answeringCoordinator) SuspectTierCopy(context.Context, *coordpb.SuspectTierCopyRequest, ...grpc.CallOption) (*coordpb.SuspectTierCopyResponse, error) {
	c.calls.Add(1)
	if c.err != nil {
		return nil, c.err
	}
	return &coordpb.SuspectTierCopyResponse{Answer: c.answer}, nil
}

// TestASuspectNotTakenIsReportedAgain: a report of a corrupt tier copy
// that the coordinator did not take (busy, no such copy yet, the call
// failed) is sent again by a read a minute after its answer, not before;
// one it took (checking, already corrupt, verified whole lately, a
// node-local copy it does not mark on one node's word) is not sent again.
func TestASuspectNotTakenIsReportedAgain(t *testing.T) {
	type testcase struct {
		answer coordpb.SuspectAnswer
		err    error
		again  bool
	}
	run := func(t *testing.T, tc testcase) {
		clk := clock.NewFake(time.Unix(1000, 0))
		a := newSuspectAgent(clk)
		coord := &answeringCoordinator{answer: tc.answer, err: tc.err}
		a.rep.c = coord
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { a.rep.sendSuspects(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		ps := PeerShard{Job: "j", Rank: 1, Step: 4, HeaderSum: "h"}
		read := func() { a.suspectTier(ps, Source{Tier: "s3", Node: "-"}, fmt.Errorf("%w: leaf", shm.ErrCorrupt)) }
		answered := func(want int32) {
			t.Helper()
			wait.ForNil(t, 10*time.Second, "the report answered", func() error {
				a.rep.suspectMu.Lock()
				defer a.rep.suspectMu.Unlock()
				if n := coord.calls.Load(); n != want || len(a.rep.suspects.queue) != 0 {
					return fmt.Errorf("%d reports sent, %d queued; want %d sent", n, len(a.rep.suspects.queue), want)
				}
				if again := a.rep.suspects.sent[suspectKey{rankKey{"j", 1}, 4, "s3"}]; tc.again == again.IsZero() {
					return fmt.Errorf("report again from %v", again)
				}
				return nil
			})
		}
		read()
		answered(1)
		read() // at once: not again, whatever the answer
		clk.Step(suspectRetry - time.Second)
		read()
		answered(1)
		clk.Step(time.Second)
		want := int32(1)
		if tc.again {
			want = 2
		}
		read()
		answered(want)
	}
	for name, tc := range map[string]testcase{
		"checking":          {answer: coordpb.SuspectAnswer_SUSPECT_ANSWER_CHECKING},
		"already corrupt":   {answer: coordpb.SuspectAnswer_SUSPECT_ANSWER_ALREADY_CORRUPT},
		"verified recently": {answer: coordpb.SuspectAnswer_SUSPECT_ANSWER_VERIFIED_RECENTLY},
		"node-local":        {answer: coordpb.SuspectAnswer_SUSPECT_ANSWER_NODE_LOCAL},
		"busy":              {answer: coordpb.SuspectAnswer_SUSPECT_ANSWER_BUSY, again: true},
		"no such copy":      {answer: coordpb.SuspectAnswer_SUSPECT_ANSWER_NO_SUCH_COPY, again: true},
		"call failed":       {err: errors.New("unavailable"), again: true},
	} {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}
