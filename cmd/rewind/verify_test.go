package main

import (
	"strings"
	"testing"

	"rewind.dev/rewind/api/coordpb"
)

// TestVerifyVerdict: what `rewind verify` says when a step did not verify
// clean is what is true: one bad copy of a rank that keeps good ones
// leaves the step restorable and is named as such; only a rank with no
// good copy, or none at all, makes the step unrestorable, and it is named.
func TestVerifyVerdict(t *testing.T) {
	check := func(rank uint32, tier, node string, ok bool) *coordpb.CopyCheck {
		return &coordpb.CopyCheck{Copy: &coordpb.Copy{Rank: rank, Tier: tier, Node: node}, Ok: ok}
	}
	// Two ranks, four copies each; one copy of rank 0 is bad.
	var oneBad []*coordpb.CopyCheck
	for r := range uint32(2) {
		oneBad = append(oneBad, check(r, "shm", "a", !(r == 0)), check(r, "shm", "b", true), check(r, "nvme", "a", true), check(r, "pfs", "-", true))
	}
	for name, tc := range map[string]struct {
		world  uint32
		checks []*coordpb.CopyCheck
		want   []string
		not    []string
	}{
		"one bad copy, every rank covered": {world: 2, checks: oneBad,
			want: []string{"1 of 8 copies failed verification (rank 0 shm:a)", "every rank still has a good copy", "restorable"},
			not:  []string{"no good copy", "cannot be restored"}},
		"a rank with no good copy": {world: 2, checks: []*coordpb.CopyCheck{check(0, "shm", "a", false), check(0, "nvme", "a", false), check(1, "shm", "b", true)},
			want: []string{"cannot be restored", "no good copy of rank 0 (2 copies, all failed)", "2 of 3 copies failed"},
			not:  []string{"every rank"}},
		"a rank with no copy": {world: 3, checks: []*coordpb.CopyCheck{check(0, "shm", "a", true), check(1, "shm", "b", true)},
			want: []string{"cannot be restored", "no copy at all of rank 2"},
			not:  []string{"no good copy"}},
	} {
		t.Run(name, func(t *testing.T) {
			err := verifyVerdict("j", 5, tc.world, tc.checks)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("verdict spans lines: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("verdict %q lacks %q", msg, w)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(msg, w) {
					t.Errorf("verdict %q says %q", msg, w)
				}
			}
		})
	}
}
