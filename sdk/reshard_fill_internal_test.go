package sdk

import (
	"testing"

	"rewind.dev/rewind/api/agentpb"
)

// TestFillCallsMergeAndSplit: the ranges of a shard's many small
// tensors, read whole, become one range; ranges apart are kept apart
// and sent in calls the agent takes (at most agentpb.MaxFillRanges each), none
// lost or changed.
func TestFillCallsMergeAndSplit(t *testing.T) {
	type tc struct {
		ranges []*agentpb.ByteRange
		want   [][2]uint64 // the merged ranges, in order
		calls  int
	}
	const n = 150_000
	touching, apart := make([]*agentpb.ByteRange, n), make([]*agentpb.ByteRange, n)
	wantApart := make([][2]uint64, n)
	for i := range n {
		j := uint64(n - 1 - i) // out of order
		touching[i] = &agentpb.ByteRange{Offset: 4096 + 8*j, Length: 8}
		apart[i] = &agentpb.ByteRange{Offset: 4096 + 16*j, Length: 8}
		wantApart[n-1-i] = [2]uint64{4096 + 16*j, 8}
	}
	cases := map[string]tc{
		"150,000 touching":  {ranges: touching, want: [][2]uint64{{4096, 8 * n}}, calls: 1},
		"150,000 apart":     {ranges: apart, want: wantApart, calls: 3},
		"overlap and inner": {ranges: []*agentpb.ByteRange{{Offset: 10, Length: 5}, {Offset: 0, Length: 12}, {Offset: 2, Length: 3}, {Offset: 20, Length: 1}}, want: [][2]uint64{{0, 15}, {20, 1}}, calls: 1},
		"none":              {calls: 0},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			calls := fillCalls(c.ranges)
			if len(calls) != c.calls {
				t.Fatalf("%d calls, want %d", len(calls), c.calls)
			}
			var got [][2]uint64
			for _, call := range calls {
				if len(call) == 0 || len(call) > agentpb.MaxFillRanges {
					t.Fatalf("a call of %d ranges; the agent takes 1 to %d", len(call), agentpb.MaxFillRanges)
				}
				for _, r := range call {
					got = append(got, [2]uint64{r.Offset, r.Length})
				}
			}
			if len(got) != len(c.want) {
				t.Fatalf("%d ranges, want %d", len(got), len(c.want))
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("range %d is %v, want %v", i, got[i], c.want[i])
				}
			}
		})
	}
}
