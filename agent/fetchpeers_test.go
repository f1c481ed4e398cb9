package agent

import (
	"errors"
	"strings"
	"testing"
)

// TestFetchSourcesValidated: a Fetch's sources are checked before any is
// tried; a bad one is ErrInvalid naming what is wrong.
func TestFetchSourcesValidated(t *testing.T) {
	many := make([]Source, maxFetchSources+1)
	for i := range many {
		many[i] = Source{Tier: "pfs", Node: "-"}
	}
	for name, tc := range map[string]struct {
		srcs []Source
		want string // "": valid
	}{
		"a plan's sources":   {[]Source{{Tier: "shm", Node: "gpu-1", Addr: "10.0.0.1:7070"}, {Tier: "nvme", Node: "gpu-1"}, {Tier: "s3", Node: "-"}}, ""},
		"no address":         {[]Source{{Tier: "shm", Node: "peer"}}, ""},
		"too many":           {many, "at most 64"},
		"an unknown tier":    {[]Source{{Tier: "tape", Node: "-"}}, `unknown tier "tape"`},
		"a node out of rule": {[]Source{{Tier: "shm", Node: "../etc", Addr: "10.0.0.1:7070"}}, "node name"},
	} {
		t.Run(name, func(t *testing.T) {
			err := validateFetchSources(tc.srcs)
			if tc.want == "" && err != nil || tc.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
