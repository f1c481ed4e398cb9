package agentpb

import (
	"cmp"
	"slices"
)

// MaxFillRanges is the most byte ranges one Fill carries: the agent
// refuses more, and a client splits what it asks for into calls of at
// most this many.
const MaxFillRanges = 1 << 16

// MergedRanges returns ranges ({offset, length}) sorted by offset, those
// that touch or overlap merged into one; ranges is left as it is.
func MergedRanges(ranges [][2]int64) [][2]int64 {
	rs := slices.SortedFunc(slices.Values(ranges), func(x, y [2]int64) int { return cmp.Compare(x[0], y[0]) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && r[0] <= out[n-1][0]+out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], r[0]+r[1]-out[n-1][0])
			continue
		}
		out = append(out, r)
	}
	return out
}
