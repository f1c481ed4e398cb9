package main

import (
	"context"
	"strings"
	"testing"

	"rewind.dev/rewind/api/coordpb"
)

// TestRestoreTableOneLinePerRank: errors joined from several (one per
// line, as errors.Join writes them) and tabs stay inside their cell: the
// table of an executed restore has a header and one line per rank.
func TestRestoreTableOneLinePerRank(t *testing.T) {
	plan := &coordpb.PlanRestoreResponse{Job: "j", Step: 5, Executed: true, Ranks: []*coordpb.RankPlan{
		{Rank: 0, TargetNode: "a", Error: "not found: agent: no source could restore job j rank 0 step 5 (2 tried):\nshm:b: checksum mismatch\nnvme:a:\tdisk gone"},
		{Rank: 1, TargetNode: "b", Used: "shm:b", Failed: []string{"nvme:b: first\nsecond", "pfs:-: third"}},
	}}
	out, err := capture(t, func(context.Context, []string) error { return printRestorePlan(plan) })
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 1+len(plan.Ranks) {
		t.Fatalf("%d lines for %d ranks:\n%s", len(lines), len(plan.Ranks), out)
	}
	for i, want := range []string{"shm:b: checksum mismatch; nvme:a: disk gone", "nvme:b: first; second; pfs:-: third"} {
		if !strings.Contains(lines[i+1], want) {
			t.Errorf("rank %d's line %q lacks %q", i, lines[i+1], want)
		}
	}
}
