package main

import (
	"testing"

	"rewind.dev/rewind/api/coordpb"
)

// TestPlacesCell: the COPIES cell of rewind ls names each place while a
// step's copies are in a few, and each tier with its nodes past that; a
// tier's node count goes with its good copies, not its corrupt ones.
func TestPlacesCell(t *testing.T) {
	few := &coordpb.StepSummary{PlacesTotal: 2, Places: []*coordpb.CopyCount{
		{Tier: "shm", Node: "node-a", Copies: 4},
		{Tier: "shm", Node: "node-b", Copies: 4, Corrupt: 1},
	}}
	many := &coordpb.StepSummary{PlacesTotal: 1025, Tiers: []*coordpb.CopyCount{
		{Tier: "shm", Copies: 16384, Corrupt: 2, Nodes: 1024},
		{Tier: "s3", Copies: 8192, Nodes: 1},
	}}
	for _, c := range []struct {
		s    *coordpb.StepSummary
		want string
	}{
		{few, "shm:node-a×4 shm:node-b×3 shm:node-b(corrupt)×1"},
		{many, "shm×16382 on 1024 nodes shm(corrupt)×2 s3×8192"},
		{&coordpb.StepSummary{}, "-"},
	} {
		if got := placesCell(c.s); got != c.want {
			t.Errorf("placesCell = %q, want %q", got, c.want)
		}
	}
}
