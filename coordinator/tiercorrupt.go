package coordinator

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// A durable tier copy one of whose shards failed its checksum (on a
// restore's fetch, rewind verify, or the check of a node's report:
// tiersuspect.go), or that the tier no longer holds at all (tiermissing.go),
// keeps its record, with the rank and
// why (tierCopy.Corrupt; a missing shard's reason begins with
// missingPrefix): it shows as corrupt, the shard leaves restore
// plans (the index keeps it among the step's bad copies), and retention
// removes the copy at its next pass over the tier. A verify that finds the
// shard whole again puts it back.

// missingPrefix begins the reason of a shard marked because the tier does
// not hold it (its object or its manifest gone), not for a checksum.
const missingPrefix = "missing: "

// markCorrupt records that rank's shard of job's step on tier failed its
// checksum (or, why beginning with missingPrefix, is not on the tier),
// and why.
func (t *tiering) markCorrupt(job string, step int64, rank uint32, tier, why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tc := t.copies[tierKey{job, step, tier}]
	if t.closed || tc == nil || tc.State != tcDurable || tc.Corrupt[rank] != "" {
		return
	}
	rec, ok := tc.record(rank, CopyCorrupt)
	if !ok {
		return
	}
	if tc.Corrupt == nil {
		tc.Corrupt = map[uint32]string{}
	}
	why = oneLine(why)
	tc.Corrupt[rank] = why
	t.persist(tc)
	if _, err := t.c.apply(func(ch *Changes) error { return t.c.state.Apply(rec, ch) }); err != nil {
		t.c.log.Error("recording a corrupt tier copy in the index", "copy", tc.String(), "rank", rank, "err", err)
	}
	what := "tier copy found corrupt: no longer a restore source"
	if strings.HasPrefix(why, missingPrefix) {
		what = "tier copy found missing from its tier: no longer a restore source, nor counted by retention"
	}
	t.c.log.Warn(what, "job", job, "step", step, "tier", tier, "rank", rank, "why", why)
}

// markWhole records that rank's shard of job's step on tier, found
// corrupt before, verified whole: it is a restore source again.
func (t *tiering) markWhole(job string, step int64, rank uint32, tier string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tc := t.copies[tierKey{job, step, tier}]
	if t.closed || tc == nil || tc.State != tcDurable || tc.Corrupt[rank] == "" {
		return
	}
	rec, ok := tc.record(rank, CopyCommitted)
	if !ok {
		return
	}
	delete(tc.Corrupt, rank)
	t.persist(tc)
	if _, err := t.c.apply(func(ch *Changes) error { return t.c.state.Apply(rec, ch) }); err != nil {
		t.c.log.Error("recording a tier copy verified whole in the index", "copy", tc.String(), "rank", rank, "err", err)
	}
	t.c.log.Info("tier copy found corrupt before verified whole: a restore source again", "job", job, "step", step, "tier", tier, "rank", rank)
}

// record returns the index's record of rank's shard in the copy.
func (tc *tierCopy) record(rank uint32, state CopyState) (Record, bool) {
	for _, s := range tc.Shards {
		if s.Rank == rank && tc.copyNode(rank) != "" {
			return Record{Job: tc.Job, Step: tc.Step, Rank: rank, WorldSize: tc.WorldSize, Node: tc.copyNode(rank),
				Tier: tc.Tier, Size: uint64(s.Size), Sum: s.HeaderChecksum, State: state}, true
		}
	}
	return Record{}, false
}

// corruptText names the copy's corrupt shards and why.
func (tc *tierCopy) corruptText() string {
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(tc.Corrupt)) {
		if why, ok := strings.CutPrefix(tc.Corrupt[r], missingPrefix); ok {
			parts = append(parts, fmt.Sprintf("rank %d missing: %s", r, why))
			continue
		}
		parts = append(parts, fmt.Sprintf("rank %d corrupt: %s", r, tc.Corrupt[r]))
	}
	return strings.Join(parts, "; ")
}
