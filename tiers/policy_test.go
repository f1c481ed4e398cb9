package tiers

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestParsePolicy(t *testing.T) {
	good := map[string]string{
		"":                    DefaultPolicy().String(),
		"nvme:every=5,keep=2": "nvme:every=5,keep=2",
		" nvme:every=5,keep=2 ; s3:every=1h,keep=4 ": "nvme:every=5,keep=2;s3:every=1h0m0s,keep=4",
	}
	for in, want := range good {
		p, err := ParsePolicy(in)
		if err != nil || p.String() != want {
			t.Errorf("ParsePolicy(%q) = %q, %v; want %q", in, p.String(), err, want)
		}
	}
	bad := map[string]string{
		"tape:every=1,keep=1":                     "unknown tier",
		"nvme:every=1,keep=0":                     "at least 1",
		"nvme:keep=2":                             "one positive",
		"nvme:every=-3,keep=2":                    "one positive",
		"nvme:every=soon,keep=2":                  "neither a step count nor a duration",
		"nvme:every=1,keep=2;nvme:every=2,keep=1": "given twice",
		"nvme every=1":                            "want TIER:",
		"nvme:every=1,keep=2,colour=red":          "unknown key",
		"s3:every=10ms,keep=1":                    "shorter than a second",
		";;;":                                     "clause 1 is empty",
		"nvme:every=1,keep=2;":                    "clause 2 is empty",
	}
	for in, want := range bad {
		_, err := ParsePolicy(in)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), in) {
			t.Errorf("ParsePolicy(%q): %v; want an error quoting the policy and saying %q", in, err, want)
		}
	}
}

func TestDue(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	steps := TierPolicy{Tier: "nvme", EverySteps: 10, Keep: 1}
	clock := TierPolicy{Tier: "s3", EveryTime: time.Minute, Keep: 1}
	cases := []struct {
		p          TierPolicy
		step, last int64
		since      time.Duration
		want       bool
	}{
		{steps, 5, -1, 0, true}, {steps, 15, 10, 0, false}, {steps, 20, 10, 0, true}, {steps, 9, 10, time.Hour, false},
		{clock, 11, 10, 59 * time.Second, false}, {clock, 11, 10, time.Minute, true}, {clock, 0, -1, 0, true},
	}
	for _, c := range cases {
		if got := c.p.Due(c.step, c.last, t0, t0.Add(c.since)); got != c.want {
			t.Errorf("%s: Due(step %d, last %d, %v later) = %v", c.p.Tier, c.step, c.last, c.since, got)
		}
	}
}

func TestRetain(t *testing.T) {
	cases := map[string]struct {
		on     []int64
		keep   int
		latest int64
		want   string
	}{
		"keeps the newest":                 {on: []int64{10, 20, 30, 40}, keep: 2, latest: 45, want: "[10 20]"},
		"nothing beyond keep":              {on: []int64{10, 20}, keep: 2, latest: 20, want: "[]"},
		"never the latest consistent step": {on: []int64{10, 20, 30}, keep: 1, latest: 20, want: "[10]"},
		"never the only copy":              {on: []int64{10}, keep: 0, latest: 99, want: "[]"},
		"unordered input":                  {on: []int64{40, 10, 30, 20}, keep: 3, latest: 40, want: "[10]"},
	}
	for name, c := range cases {
		if got := fmt.Sprint(nonNil(Retain(c.on, c.keep, c.latest))); got != c.want {
			t.Errorf("%s: Retain = %s, want %s", name, got, c.want)
		}
	}
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}
