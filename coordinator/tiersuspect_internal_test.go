package coordinator

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
)

// TestSuspectChecksBoundedPerReporter: one node's reports start at most
// maxSuspectsPerNode checks at once, the rest answered busy, and do not
// take the room another node's report needs; a shard being checked is
// checking for anyone who reports it, one verified whole lately is not
// checked again, and a check over frees its reporter's room.
func TestSuspectChecksBoundedPerReporter(t *testing.T) {
	s := newSuspects()
	now := time.Unix(1000, 0)
	key := func(rank uint32) suspectKey { return suspectKey{"j", 5, rank, "s3"} }
	begin := func(k suspectKey, node string, want coordpb.SuspectAnswer, wantStart bool) {
		t.Helper()
		if got, start := s.begin(k, node, now); got != want || start != wantStart {
			t.Fatalf("%s reporting rank %d: %s, start %t; want %s, %t", node, k.rank, got.Label(), start, want.Label(), wantStart)
		}
	}
	const checking, busy = coordpb.SuspectAnswer_SUSPECT_ANSWER_CHECKING, coordpb.SuspectAnswer_SUSPECT_ANSWER_BUSY
	for r := range uint32(maxSuspectsPerNode) {
		begin(key(r), "liar", checking, true)
	}
	for r := range uint32(3 * maxSuspectsPerNode) {
		begin(key(100+r), "liar", busy, false)
	}
	begin(key(0), "node-1", checking, false) // under way already
	begin(key(200), "node-1", checking, true)
	s.end(key(0), true, now)
	begin(key(0), "node-1", coordpb.SuspectAnswer_SUSPECT_ANSWER_VERIFIED_RECENTLY, false)
	begin(key(100), "liar", checking, true)
	begin(key(101), "liar", busy, false)
	now = now.Add(suspectRecheck)
	begin(key(0), "node-2", checking, true)
}

// TestSuspectTotalChecksBounded: many reporters together start at most
// maxSuspectsPending checks.
func TestSuspectTotalChecksBounded(t *testing.T) {
	s := newSuspects()
	now := time.Unix(1000, 0)
	started := 0
	for n := range 2 * maxSuspectsPending / maxSuspectsPerNode {
		for r := range uint32(maxSuspectsPerNode) {
			if _, start := s.begin(suspectKey{"j", 5, uint32(n)*100 + r, "pfs"}, fmt.Sprintf("node-%d", n), now); start {
				started++
			}
		}
	}
	if started != maxSuspectsPending {
		t.Fatalf("%d checks started, want %d", started, maxSuspectsPending)
	}
}

// TestASuspectFoundCorruptMarkedOnlyByTheLeader: a check whose verify
// fails marks the copy only while this replica leads: one that lost the
// lead meanwhile leaves it to the leader.
func TestASuspectFoundCorruptMarkedOnlyByTheLeader(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	if s := c.tiers.mergePage("node-0", []*agentpb.TierManifest{listed("s3", "j", 5, 2, nil, nil)}); s.failed != nil || s.added != 1 {
		t.Fatalf("merging an s3 copy: %+v", s)
	}
	leading := false
	c.cfg.Leading = func() bool { return leading }
	k := suspectKey{"j", 5, 1, "s3"}
	corrupt := func() string {
		c.tiers.mu.Lock()
		defer c.tiers.mu.Unlock()
		return c.tiers.copies[tierKey{"j", 5, "s3"}].Corrupt[1]
	}
	if c.settleSuspect(k, "node-1", "node-0", false, "rotten", nil) || corrupt() != "" {
		t.Fatalf("a follower marked the copy: %q", corrupt())
	}
	leading = true
	if c.settleSuspect(k, "node-1", "node-0", false, "rotten", nil) || corrupt() == "" {
		t.Fatal("the leader did not mark the copy")
	}
}

// TestSuspectAnswers: what a report of a copy is answered without a
// check: a node's own NVMe copy is not checked (no other node can read
// it) nor marked; another node's NVMe copy, a header checksum the index
// does not hold, a step it has no copy of, are no such copy; a shard
// marked corrupt is that.
func TestSuspectAnswers(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	pms := []*agentpb.TierManifest{listed("s3", "j", 5, 2, nil, nil), listed("nvme", "j", 5, 2, []uint32{0}, nil)}
	if s := c.tiers.mergePage("node-0", pms); s.failed != nil {
		t.Fatalf("merging: %+v", s)
	}
	c.tiers.markCorrupt("j", 5, 1, "s3", "rotten")
	for name, tc := range map[string]struct {
		req  *coordpb.SuspectTierCopyRequest
		want coordpb.SuspectAnswer
	}{
		"own nvme":        {&coordpb.SuspectTierCopyRequest{Node: "node-0", Job: "j", Step: 5, Rank: 0, Tier: "nvme"}, coordpb.SuspectAnswer_SUSPECT_ANSWER_NODE_LOCAL},
		"another's nvme":  {&coordpb.SuspectTierCopyRequest{Node: "node-1", Job: "j", Step: 5, Rank: 0, Tier: "nvme"}, coordpb.SuspectAnswer_SUSPECT_ANSWER_NO_SUCH_COPY},
		"other checksum":  {&coordpb.SuspectTierCopyRequest{Node: "node-1", Job: "j", Step: 5, Rank: 0, Tier: "s3", HeaderChecksum: "x"}, coordpb.SuspectAnswer_SUSPECT_ANSWER_NO_SUCH_COPY},
		"no such step":    {&coordpb.SuspectTierCopyRequest{Node: "node-1", Job: "j", Step: 6, Rank: 0, Tier: "s3"}, coordpb.SuspectAnswer_SUSPECT_ANSWER_NO_SUCH_COPY},
		"already corrupt": {&coordpb.SuspectTierCopyRequest{Node: "node-1", Job: "j", Step: 5, Rank: 1, Tier: "s3"}, coordpb.SuspectAnswer_SUSPECT_ANSWER_ALREADY_CORRUPT},
	} {
		if got, err := c.SuspectTierCopy(tc.req); err != nil || got != tc.want {
			t.Errorf("%s: %s %v, want %s", name, got.Label(), err, tc.want.Label())
		}
	}
	c.tiers.mu.Lock()
	defer c.tiers.mu.Unlock()
	if why := c.tiers.copies[tierKey{"j", 5, "nvme"}].Corrupt[0]; why != "" {
		t.Fatalf("node-0's NVMe copy marked on its own word: %q", why)
	}
}
