package coordinator

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/tiers"
)

// Merging what a listing found into the index (rediscover.go lists).

// found is a manifest to merge: the copy it makes, or a node-local copy
// extended with the listing node's ranks (a copy of the known one, which
// replaces it once recorded), and the ranks it adds.
type found struct {
	tc    *tierCopy
	ranks []uint32
}

// verdict is what a listed manifest is to the index (classify).
type verdict int

const (
	// verdictRefused: the manifest does not validate, or disagrees with
	// the index; the error says why.
	verdictRefused verdict = iota
	// verdictAdd: a copy the index does not know, or a node's part of a
	// node-local copy it knows from other nodes: merged.
	verdictAdd
	// verdictKnown: the index has it already: left alone.
	verdictKnown
	// verdictDeleted: a copy of a step being deleted: its deletion is
	// ordered, and it is not indexed.
	verdictDeleted
)

// mergePage merges one page of manifests listed by node.
func (t *tiering) mergePage(node string, page []*agentpb.TierManifest) listStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	var s listStats
	if t.closed {
		return s
	}
	var todo []found
	for _, pm := range page {
		s.listed++
		f, what, err := t.classify(node, pm)
		switch {
		case err != nil:
			s.conflicts++
			t.c.log.Warn("tier copy found on a tier not merged", "node", node, "tier", pm.Tier, "job", pm.Job, "step", pm.Step, "err", err)
		case what == verdictKnown:
			s.known++
		case what == verdictDeleted:
			s.deleted++
		default:
			todo = append(todo, f)
		}
	}
	if len(todo) == 0 {
		return s
	}
	merged, err := t.merge(todo)
	if err != nil {
		t.c.log.Error("recording rediscovered tier copies", "node", node, "err", err)
		s.failed = err
	}
	for _, f := range merged {
		tc := f.tc
		t.copies[tc.key()] = tc
		k := tc.Job + "/" + tc.Tier
		if _, ok := t.lastStep[k]; !ok || tc.Step >= t.lastStep[k] {
			t.last[k], t.lastStep[k] = tc.Started, tc.Step
		}
		t.m.rediscovered.WithLabelValues(tc.Tier).Inc()
		t.c.log.Info("tier copy rediscovered", "job", tc.Job, "step", tc.Step, "tier", tc.Tier, "node", node,
			"ranks", len(f.ranks), "world_size", tc.WorldSize)
		s.added++
	}
	s.conflicts += len(todo) - len(merged)
	return s
}

// classify decides what a listed manifest is to the index, and returns
// the copy to add or extend with verdictAdd; with verdictDeleted it has
// ordered the copy's deletion. The caller holds t.mu.
func (t *tiering) classify(node string, pm *agentpb.TierManifest) (found, verdict, error) {
	if _, err := tiers.ParseName(pm.Tier); err != nil {
		return found{}, verdictRefused, fmt.Errorf("%w: coordinator: %w", ErrInvalid, err)
	}
	m := manifestOf(pm)
	if err := m.Validate(); err != nil {
		return found{}, verdictRefused, fmt.Errorf("%w: coordinator: %v", ErrInvalid, err)
	}
	local := tiers.Name(pm.Tier).NodeLocal()
	k := tierKey{m.Job, m.Step, pm.Tier}
	if t.rd.gone[k] {
		return found{}, verdictKnown, nil // deleted while the listing ran
	}
	ranks := held(m)
	tc := t.copies[k]
	if tc == nil {
		tc = &tierCopy{Job: m.Job, Step: m.Step, Tier: pm.Tier, State: tcDurable, WorldSize: m.WorldSize,
			Holders: map[uint32]string{}, Done: map[uint32]uint64{}, Failed: map[uint32]string{}, Shards: m.Shards,
			Manifests: map[string]bool{node: true}, Deletes: map[string]bool{}, Started: m.WrittenAt, Finished: m.WrittenAt,
			Rediscovered: true}
		if tc.Started.IsZero() {
			tc.Started = t.c.cfg.Clock.Now()
			tc.Finished = tc.Started
		}
		for _, r := range ranks {
			tc.Holders[r], tc.Done[r] = node, uint64(m.Shards[r].Size)
		}
		if t.rd.deleted[StepKey{m.Job, m.Step}] {
			// An operator deleted the step before this copy was known:
			// it goes too.
			tc.State = tcDeleting
			t.copies[k] = tc
			t.sendDeletes(tc)
			t.c.log.Info("tier copy of a deleted step found; deleting it", "job", m.Job, "step", m.Step, "tier", pm.Tier, "node", node)
			return found{}, verdictDeleted, nil
		}
		return found{tc: tc, ranks: ranks}, verdictAdd, nil
	}
	if !local || tc.Manifests[node] || tc.Deletes[node] {
		return found{}, verdictKnown, nil
	}
	// A node-local copy known from other nodes: this node's part of it.
	var add []uint32
	for _, r := range ranks {
		if _, ok := tc.Holders[r]; !ok {
			add = append(add, r)
		}
	}
	switch {
	case tc.State == tcDeleting:
		if _, asked := tc.Deletes[node]; asked {
			return found{}, verdictKnown, nil
		}
		for _, r := range add {
			tc.Holders[r] = node
		}
		t.sendDeletes(tc) // asks the nodes not asked yet: this one
		return found{}, verdictDeleted, nil
	case !tc.Rediscovered || tc.State != tcDurable || len(add) == 0:
		return found{}, verdictKnown, nil
	case tc.WorldSize != m.WorldSize || !slices.Equal(tc.Shards, m.Shards):
		return found{}, verdictRefused, fmt.Errorf("%w: coordinator: %s's manifest of %s disagrees with the other nodes' (world size %d, shards differ)",
			ErrRefused, node, tc, m.WorldSize)
	}
	ext := *tc
	ext.Holders, ext.Done, ext.Manifests = maps.Clone(tc.Holders), maps.Clone(tc.Done), maps.Clone(tc.Manifests)
	for _, r := range add {
		ext.Holders[r], ext.Done[r] = node, uint64(m.Shards[r].Size)
	}
	ext.Manifests[node] = true
	return found{tc: &ext, ranks: add}, verdictAdd, nil
}

// merge records rediscovered copies: in one synced batch their tier copy
// records, then their shards in the index (a crash between the two is
// healed by load, which indexes durable copies again). A manifest that
// disagrees with the index (another world size or checksum for a step it
// holds) is left out and logged. It returns what was merged. The caller
// holds t.mu.
func (t *tiering) merge(todo []found) ([]found, error) {
	var merged []found
	_, err := t.c.apply(func(ch *Changes) error {
		s := t.c.state
		for _, f := range todo {
			if err := t.agrees(f); err != nil {
				t.c.log.Warn("tier copy found on a tier not merged", "copy", f.tc.String(), "err", err)
				continue
			}
			merged = append(merged, f)
		}
		if len(merged) == 0 {
			return nil
		}
		b := t.c.store.db.NewBatch()
		defer b.Close()
		for _, f := range merged {
			if err := putTierCopyBatch(b, f.tc); err != nil {
				return err
			}
		}
		if err := b.Commit(pebble.Sync); err != nil {
			merged = nil
			return fmt.Errorf("coordinator: persisting rediscovered tier copies: %w", err)
		}
		var errs []error
		for _, f := range merged {
			errs = append(errs, t.indexFound(s, f, ch))
		}
		ch.Sync = true
		return errors.Join(errs...)
	})
	return merged, err
}

// agrees checks a found copy against the index: a step the index holds
// must have the manifest's world size and, for every rank with a copy,
// its checksum (a step number saved again after a restart from an older
// step is another checkpoint). The caller holds c.mu.
func (t *tiering) agrees(f found) error {
	j := t.c.state.Jobs[f.tc.Job]
	if j == nil {
		return nil
	}
	st := j.Steps[f.tc.Step]
	if st == nil {
		return nil
	}
	if st.WorldSize != f.tc.WorldSize {
		return fmt.Errorf("%w: coordinator: the index holds %s step %d at world size %d, the manifest says %d",
			ErrRefused, f.tc.Job, f.tc.Step, st.WorldSize, f.tc.WorldSize)
	}
	for _, r := range f.ranks {
		e := f.tc.Shards[r]
		for _, cp := range st.Copies[r] {
			if cp.Sum != e.HeaderChecksum || cp.Size != uint64(e.Size) {
				return fmt.Errorf("%w: coordinator: rank %d of %s step %d has checksum %s on %s/%s, the manifest says %s",
					ErrRefused, r, f.tc.Job, f.tc.Step, cp.Sum, cp.Tier, cp.Node, e.HeaderChecksum)
			}
		}
	}
	return nil
}

// indexFound records a found copy's shards in the index, creating its job
// (with the manifest's world size) and step when the index lacks them. A
// node-local copy places the ranks it holds on its node where the job has
// no placement for them. The caller holds c.mu.
func (t *tiering) indexFound(s *State, f found, ch *Changes) error {
	tc := f.tc
	local := tiers.Name(tc.Tier).NodeLocal()
	j := s.Jobs[tc.Job]
	if j == nil {
		if _, err := s.RegisterJob(tc.Job, tc.WorldSize, nil, ch); err != nil {
			return err
		}
		j = s.Jobs[tc.Job]
		t.c.log.Info("job rediscovered from a tier copy", "job", tc.Job, "world_size", tc.WorldSize, "tier", tc.Tier)
	}
	if local && j.WorldSize == tc.WorldSize {
		place := map[uint32]string{}
		for _, r := range f.ranks {
			if _, ok := j.Placement[r]; !ok {
				place[r] = tc.Holders[r]
			}
		}
		if len(place) > 0 {
			if _, err := s.RegisterJob(tc.Job, j.WorldSize, place, ch); err != nil {
				return err
			}
		}
	}
	if j.Steps[tc.Step] == nil && j.WorldSize != tc.WorldSize {
		// A step of another world size than the job's (before an elastic
		// restart): Apply checks reports against the step's.
		st := &Step{Job: tc.Job, Step: tc.Step, WorldSize: tc.WorldSize, State: Partial, Copies: map[uint32][]*Copy{}}
		j.Steps[tc.Step] = st
		ch.Steps = append(ch.Steps, st)
	}
	var errs []error
	for _, r := range f.ranks {
		e := tc.Shards[r]
		rec := Record{Job: tc.Job, Step: tc.Step, Rank: r, WorldSize: tc.WorldSize, Node: tc.copyNode(r), Tier: tc.Tier,
			Size: uint64(e.Size), Sum: e.HeaderChecksum, State: CopyCommitted}
		if err := s.Apply(rec, ch); err != nil {
			errs = append(errs, err)
		}
	}
	if st := j.Steps[tc.Step]; st != nil && len(st.Copies) == 0 { // nothing applied: no empty step left behind
		delete(j.Steps, tc.Step)
		ch.Steps = slices.DeleteFunc(ch.Steps, func(x *Step) bool { return x == st })
	}
	return errors.Join(errs...)
}

// putTierCopyBatch adds a tier copy's record to a batch.
func putTierCopyBatch(b *pebble.Batch, tc *tierCopy) error {
	data, err := json.Marshal(tc)
	if err != nil {
		return err
	}
	return b.Set(tierCopyKey(tc.Job, tc.Step, tc.Tier), data, nil)
}
