package coordpb

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"rewind.dev/rewind/tiers"
)

// CopyCounter counts a step's copies into a StepSummary: the coordinator
// counts its index with it, and a client the copies of a coordinator
// that sends no summary. The zero value is ready to count.
type CopyCounter struct {
	s      StepSummary
	places map[[2]string]*CopyCount // tier, node
	tiers  map[string]*CopyCount
	sized  map[uint32]bool // ranks whose size is in StepBytes
}

// Add counts a copy of rank's shard of size bytes on tier of node, found
// corrupt or not; a corrupt copy's bytes are not counted.
func (c *CopyCounter) Add(tier, node string, rank uint32, size uint64, corrupt bool) {
	if c.places == nil {
		c.places, c.tiers, c.sized = map[[2]string]*CopyCount{}, map[string]*CopyCount{}, map[uint32]bool{}
	}
	t := c.tiers[tier]
	if t == nil {
		t = &CopyCount{Tier: tier}
		c.tiers[tier] = t
	}
	p := c.places[[2]string{tier, node}]
	if p == nil {
		p = &CopyCount{Tier: tier, Node: node}
		c.places[[2]string{tier, node}], t.Nodes = p, t.Nodes+1
	}
	s := &c.s
	s.Copies, p.Copies, t.Copies = s.Copies+1, p.Copies+1, t.Copies+1
	if corrupt {
		s.Corrupt, p.Corrupt, t.Corrupt = s.Corrupt+1, p.Corrupt+1, t.Corrupt+1
		return
	}
	s.Bytes, p.Bytes, t.Bytes = s.Bytes+size, p.Bytes+size, t.Bytes+size
	if !c.sized[rank] {
		c.sized[rank], s.StepBytes = true, s.StepBytes+size
	}
}

// Summary returns what was counted, tiers and places in the order a
// restore prefers them (memory, then the durable tiers nearest first,
// then by name), naming the first maxPlaces places (every one for 0).
func (c *CopyCounter) Summary(maxPlaces int) *StepSummary {
	s := &StepSummary{Copies: c.s.Copies, Corrupt: c.s.Corrupt, Bytes: c.s.Bytes, StepBytes: c.s.StepBytes}
	s.Tiers = slices.SortedFunc(maps.Values(c.tiers), byPlace)
	all := slices.SortedFunc(maps.Values(c.places), byPlace)
	if maxPlaces == 0 {
		maxPlaces = len(all)
	}
	s.PlacesTotal, s.Places = uint32(len(all)), all[:min(len(all), maxPlaces)]
	return s
}

func byPlace(a, b *CopyCount) int {
	return cmp.Or(cmp.Compare(tierOrder(a.Tier), tierOrder(b.Tier)), strings.Compare(a.Tier, b.Tier), strings.Compare(a.Node, b.Node))
}

// tierOrder orders tiers as a restore prefers them: memory, then the
// durable tiers in tiers.Names' order, then any other.
func tierOrder(tier string) int {
	if tier == "shm" {
		return 0
	}
	if i := slices.Index(durableTiers, tiers.Name(tier)); i >= 0 {
		return 1 + i
	}
	return 1 + len(durableTiers)
}

var durableTiers = tiers.Names()
