package coordinator

import (
	"fmt"
	"testing"
	"time"

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
