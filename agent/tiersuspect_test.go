package agent

import (
	"fmt"
	"io"
	"log/slog"
	"testing"

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
	a := &Agent{cfg: Config{Node: "n0"}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a.rep = &reporter{a: a, suspects: newSuspects()}
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
