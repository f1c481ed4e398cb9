package tiers

import (
	"slices"
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	if got, want := Names(), []Name{NVMe, PFS, S3}; !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v (nearest first)", got, want)
	}
	Names()[0] = "tape" // a caller's copy: the list itself stays
	if Names()[0] != NVMe {
		t.Fatal("Names() hands out the list itself")
	}
	for _, n := range Names() {
		if got, err := ParseName(string(n)); err != nil || got != n {
			t.Errorf("ParseName(%q) = %q, %v", n, got, err)
		}
		if n.NodeLocal() != (n == NVMe) {
			t.Errorf("%s.NodeLocal() = %v", n, n.NodeLocal())
		}
	}
	for _, bad := range []string{"", "tape", "NVMe", "shm"} {
		if _, err := ParseName(bad); err == nil || !strings.Contains(err.Error(), "nvme, pfs, s3") {
			t.Errorf("ParseName(%q) = %v, want an error listing the tiers", bad, err)
		}
		if Name(bad).Valid() {
			t.Errorf("%q is valid", bad)
		}
	}
}
