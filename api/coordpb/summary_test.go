package coordpb

import "testing"

// TestCopyCounter: corrupt copies are counted but not their bytes, a
// step's size counts one copy a rank, a tier counts its nodes, and tiers
// and places come in restore order, the places cut at maxPlaces.
func TestCopyCounter(t *testing.T) {
	var c CopyCounter
	c.Add("s3", "-", 0, 10, false)
	c.Add("shm", "node-b", 1, 20, false)
	c.Add("shm", "node-a", 0, 10, false)
	c.Add("shm", "node-a", 1, 20, true)
	c.Add("nvme", "node-a", 0, 10, false)
	s := c.Summary(2)
	if s.Copies != 5 || s.Corrupt != 1 || s.Bytes != 50 || s.StepBytes != 30 || s.PlacesTotal != 4 {
		t.Fatalf("summary %v: want 5 copies, 1 corrupt, 50 bytes, 30 a step, 4 places", s)
	}
	var order []string
	for _, p := range s.Places {
		order = append(order, p.Tier+":"+p.Node)
	}
	if len(order) != 2 || order[0] != "shm:node-a" || order[1] != "shm:node-b" {
		t.Fatalf("places %v: want shm:node-a shm:node-b (the first 2 of 4)", order)
	}
	if len(s.Tiers) != 3 || s.Tiers[0].Tier != "shm" || s.Tiers[0].Nodes != 2 || s.Tiers[0].Corrupt != 1 || s.Tiers[1].Tier != "nvme" || s.Tiers[2].Tier != "s3" {
		t.Fatalf("tiers %v: want shm (2 nodes, 1 corrupt), nvme, s3", s.Tiers)
	}
	if all := c.Summary(0); len(all.Places) != 4 {
		t.Fatalf("Summary(0) names %d places, want all 4", len(all.Places))
	}
}
