package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/faultinject"
)

// Reports are applied in groups, as LevelDB's and pebble's writers commit:
// a report joins a queue; the report at its head leads, takes every report
// queued so far, applies them all under one hold of the index lock, stages
// their writes in one batch and commits it once, synced when any of them
// decided a state (one sync for many deciding writes). Every report of the
// group is answered only after that commit, so a step is never said to be
// consistent before the write that decided it is synced. The leader then
// hands the lead to the next report queued meanwhile. Under a burst (every
// agent of a synchronous job reporting the same step) this replaces a lock
// hand-off, a batch commit and possibly a sync per report with one per group.

// maxGroup bounds the reports one leader applies, so its own answer and
// its group's are not held back without end by a long burst.
const maxGroup = 256

// maxKeptCopies bounds the copy list a leader keeps for the next group:
// a group of 8,192 ranks' commits and deletions fits.
const maxKeptCopies = 1 << 15

// pendingReport is one agent report waiting in the queue.
type pendingReport struct {
	node string
	recs []Record
	// wake receives once: the report was answered, or it leads now.
	wake chan struct{}

	// Set by the leader before wake, read by the report's goroutine after.
	answered   bool
	consistent []StepKey
	pins       []*coordpb.Pin
	err        error
}

// reportResult is what a report's answer carries.
type reportResult struct {
	Consistent []StepKey      // steps this report made consistent, synced
	Pins       []*coordpb.Pin // latest consistent step of the node's jobs
}

// report applies a batch of shard events from node in order, grouped with
// the reports of other agents that arrive meanwhile. Events that are
// refused (an unknown job, a bad rank) are logged and counted; the rest
// still land. It fails when every event was refused or the store failed.
func (c *Coordinator) report(node string, recs []Record) (reportResult, error) {
	p := &pendingReport{node: node, recs: recs, wake: make(chan struct{}, 1)}
	c.qmu.Lock()
	c.queue = append(c.queue, p)
	lead := len(c.queue) == 1
	c.qmu.Unlock()
	if !lead {
		<-p.wake
		if p.answered {
			return reportResult{Consistent: p.consistent, Pins: p.pins}, p.err
		}
	}
	c.qmu.Lock()
	group := append([]*pendingReport(nil), c.queue[:min(len(c.queue), maxGroup)]...)
	c.qmu.Unlock()

	c.applyGroup(group)

	c.qmu.Lock()
	rest := copy(c.queue, c.queue[len(group):])
	clear(c.queue[rest:])
	c.queue = c.queue[:rest]
	for _, g := range group {
		g.answered = true
		if g != p {
			g.wake <- struct{}{}
		}
	}
	if len(c.queue) > 0 {
		c.queue[0].wake <- struct{}{} // the next leader
	}
	c.qmu.Unlock()
	return reportResult{Consistent: p.consistent, Pins: p.pins}, p.err
}

// applyGroup applies the group's reports under one hold of the lock and
// one store commit, and fills in each report's answer.
func (c *Coordinator) applyGroup(group []*pendingReport) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ch Changes
	n := 0
	for _, p := range group {
		n += len(p.recs)
	}
	ch.Copies = slices.Grow(c.groupCopies[:0], n)
	defer func() { // kept for the next group, holding nothing, unless a rare burst made it large
		clear(ch.Copies)
		c.groupCopies = nil
		if cap(ch.Copies) <= maxKeptCopies {
			c.groupCopies = ch.Copies[:0]
		}
	}()
	counts := map[reportCount]int{}
	for _, p := range group {
		from, refused, fenced := len(ch.Consistent), 0, 0
		var first error
		for _, r := range p.recs {
			err := c.state.Apply(r, &ch)
			counts[reportCount{r.State, err == nil}]++
			if err != nil && first == nil {
				first = err
			}
			switch {
			case errors.Is(err, ErrFenced):
				fenced++
			case err != nil:
				refused++
			}
		}
		if refused+fenced > 0 {
			c.log.Warn("refused shard reports", "node", p.node, "count", refused+fenced, "fenced", fenced, "first", first)
			c.metrics.fenced.Add(float64(fenced))
		}
		// A fenced report is answered with the job's pins, which carry its
		// epoch: that is how the agent learns to stop the old gang's ranks.
		if refused > 0 && refused+fenced == len(p.recs) {
			p.err = first
		}
		p.consistent = ch.Consistent[from:len(ch.Consistent):len(ch.Consistent)]
	}
	c.metrics.countReports(counts)
	err := c.faultAtConsistent(&ch, faultinject.CoordBeforeConsistent)
	if err != nil {
		err = c.reload(err) // applied in memory, not stored: memory must not tell it
	} else if err = c.persist(&ch); err == nil {
		err = c.faultAtConsistent(&ch, faultinject.CoordConsistentStored)
	}
	if err != nil {
		for _, p := range group {
			p.err, p.consistent = err, nil
		}
		return
	}
	for _, p := range group {
		if p.err == nil {
			p.pins = c.pinsLocked(p.node, p.recs)
		}
	}
	for _, k := range ch.Consistent { // the agents are told
		if j := c.state.Jobs[k.Job]; j != nil {
			j.answer(k.Step)
		}
	}
	if len(ch.Consistent) > 0 {
		c.tiers.poke() // a newly consistent step may be due on a tier
		c.jobs.consistent(ch.Consistent)
	}
	for _, p := range group {
		if p.err == nil {
			c.replication.noteCommits(p.recs)
		}
	}
	c.freeDroppedLocked(ch.Copies)
}

// freeDroppedLocked starts deleting the dropped ranks' copies
// (dropranks.go) of the jobs whose copies changed. The caller holds c.mu.
func (c *Coordinator) freeDroppedLocked(changed []CopyKey) {
	if c.closing {
		return
	}
	var drop []droppedKey
	seen := map[string]bool{}
	for _, k := range changed {
		if seen[k.Job] {
			continue
		}
		seen[k.Job] = true
		if j := c.state.Jobs[k.Job]; j != nil {
			drop = append(drop, c.droppedCopiesLocked(j)...)
		}
	}
	if len(drop) > 0 {
		c.bg.Add(1)
		go func() {
			defer c.bg.Done()
			c.freeDropped(c.bgCtx, drop)
		}()
	}
}

// reportCount keys the report counter: a shard state and whether it was
// recorded.
type reportCount struct {
	state CopyState
	ok    bool
}

// countReports adds counts to the report counter. States other than the
// known ones are counted as "other", so bad input cannot grow the label
// set.
func (m *metrics) countReports(counts map[reportCount]int) {
	for k, n := range counts {
		state, result := string(k.state), "ok"
		switch k.state {
		case CopyCommitted, CopyDeleted, CopyCorrupt:
		default:
			state = "other"
		}
		if !k.ok {
			result = "refused"
		}
		m.reports.WithLabelValues(state, result).Add(float64(n))
	}
}

// pinsLocked returns the pins (latest consistent and protected steps) of
// every job named in recs or placed on node. The caller holds c.mu.
func (c *Coordinator) pinsLocked(node string, recs []Record) []*coordpb.Pin {
	var pins []*coordpb.Pin
	add := func(id string) {
		for _, p := range pins {
			if p.Job == id {
				return
			}
		}
		if c.rebuildingLocked(id) != nil {
			return // not rebuilt yet: the agent keeps the pins it has
		}
		if j := c.state.Jobs[id]; j != nil { // -1 too: an agent drops a pin that no longer holds
			pins = append(pins, &coordpb.Pin{Job: id, Step: j.answer(j.Latest), Protected: j.Protected, Epoch: j.epochOf(), EpochStep: j.epochStep()})
		}
	}
	for id := range c.state.JobsOn(node) {
		add(id)
	}
	for _, r := range recs {
		add(r.Job)
	}
	return pins
}

// faultAtConsistent fires point (coordinator/before-consistent before
// the changes are stored, coordinator/consistent-stored after, before any
// answer) when the changes make a step consistent.
func (c *Coordinator) faultAtConsistent(ch *Changes, point string) error {
	if len(ch.Consistent) == 0 {
		return nil
	}
	if err := c.cfg.Faults.Check(context.Background(), point); err != nil {
		return fmt.Errorf("coordinator: recording step %d of %s consistent: %w", ch.Consistent[0].Step, ch.Consistent[0].Job, err)
	}
	return nil
}
