package coordinator

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// Elastic recovery (docs/design/20261128_elastic_recovery.md). A job
// registered with a minimum world size does not wait, nor double ranks
// up, when a node dies and no spare node can take its ranks: the
// recovery restores the newest step whose every rank is still held (in a
// live node's memory or on a shared tier), as always, and restarts the
// job with the ranks of the live nodes only, numbered anew, each rank of
// the new gang restoring its part of the step by resharding
// (sdk.Session.RestoreInto, rewind.dcp.Reader). At the next operator
// restart, or a recovery that leaves spare nodes, a job below its full
// size grows back onto the spare nodes, as many ranks on each as its
// nodes run, up to the size it registered with.

// elasticPolicy is a job's elastic setting, stored as JSON under
// elastic/<job>.
type elasticPolicy struct {
	Min  uint32 `json:"min"`           // the least world size; 0: elastic recovery off
	Full uint32 `json:"full"`          // the world size the job registered with
	Why  string `json:"why,omitempty"` // why the job runs at another world size, if it does
}

// elasticJobs holds every job's elastic setting, under its own lock.
type elasticJobs struct {
	mu   sync.Mutex
	jobs map[string]elasticPolicy
}

func (e *elasticJobs) get(job string) elasticPolicy {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.jobs[job]
}

// validateElastic checks a job's minimum world size against the world
// size it registers with; it changes nothing.
func validateElastic(job string, minSize, worldSize uint32) error {
	if minSize > worldSize {
		return fmt.Errorf("%w: coordinator: job %s: elastic minimum world size %d is above its world size %d", ErrInvalid, job, minSize, worldSize)
	}
	return nil
}

// setElastic sets job's minimum world size (0: off), the job registering
// with worldSize: its full size, the largest it registered with.
func (c *Coordinator) setElastic(job string, minSize, worldSize uint32) error {
	if err := validateElastic(job, minSize, worldSize); err != nil {
		return err
	}
	c.elastic.mu.Lock()
	defer c.elastic.mu.Unlock()
	old := c.elastic.jobs[job]
	p := elasticPolicy{Min: minSize, Full: max(worldSize, old.Full), Why: old.Why}
	if minSize == 0 {
		p = elasticPolicy{}
	}
	if p == old {
		return nil
	}
	if err := c.store.putElastic(job, p); err != nil {
		return err
	}
	c.elastic.jobs[job] = p
	return nil
}

// noteWorldSize records why job now runs at worldSize (an elastic
// recovery, or growing back to its full size).
func (c *Coordinator) noteWorldSize(job string, worldSize uint32, why string) {
	c.elastic.mu.Lock()
	defer c.elastic.mu.Unlock()
	p, ok := c.elastic.jobs[job]
	if !ok {
		return
	}
	if worldSize == p.Full {
		why = ""
	}
	p.Why = why
	if err := c.store.putElastic(job, p); err != nil {
		c.log.Warn("recording why a job's world size changed", "job", job, "err", err)
	}
	c.elastic.jobs[job] = p
}

// gangTarget is what a re-gang restarts a job as: its ranks' placement,
// and their world size.
type gangTarget struct {
	placement map[uint32]string
	worldSize uint32
	why       string // set when the world size changes
}

// elasticTarget returns the shrunk gang of an elastic job that lost
// nodes no spare can replace (ok false when the job is not elastic, spares
// hold every lost rank, or too few ranks would be left).
func (c *Coordinator) elasticTarget(job, lost string) (gangTarget, bool) {
	p := c.elastic.get(job)
	if p.Min == 0 {
		return gangTarget{}, false
	}
	c.mu.Lock()
	j := c.state.Jobs[job]
	if j == nil {
		c.mu.Unlock()
		return gangTarget{}, false
	}
	placement := maps.Clone(j.Placement)
	world := j.WorldSize
	lostNodes := map[string]bool{} // read under the lock, used after it
	for _, n := range placement {
		if c.downLocked(n) {
			lostNodes[n] = true
		}
	}
	spares := c.sparesLocked(placement)
	c.mu.Unlock()
	if uint32(len(placement)) != world {
		return gangTarget{}, false // a placement the index does not know whole
	}
	next, ok := shrinkPlacement(placement, func(n string) bool { return lostNodes[n] }, spares)
	if !ok {
		return gangTarget{}, false
	}
	m := uint32(len(next))
	if m < p.Min {
		c.log.Warn("elastic job cannot shrink: too few ranks left on live nodes; its lost ranks double up on them instead",
			"job", job, "ranks_left", m, "min_world_size", p.Min)
		return gangTarget{}, false
	}
	return gangTarget{placement: next, worldSize: m,
		why: fmt.Sprintf("elastic recovery: node %s lost and no spare node: %d of %d ranks left (at least %d)", lost, m, world, p.Min)}, true
}

// growTarget returns the grown gang of an elastic job below its full
// size, placed on placement, when live nodes running none of its ranks
// can take more (ok false when the job is not elastic, is at its full
// size, runs an uneven number of ranks per node, or no node is spare).
func (c *Coordinator) growTarget(job string, placement map[uint32]string) (gangTarget, bool) {
	p := c.elastic.get(job)
	world := uint32(len(placement))
	if p.Min == 0 || world >= p.Full || world == 0 {
		return gangTarget{}, false
	}
	c.mu.Lock()
	spares := c.sparesLocked(placement)
	c.mu.Unlock()
	next, ok := growPlacement(placement, spares, p.Full)
	if !ok {
		return gangTarget{}, false
	}
	return gangTarget{placement: next, worldSize: uint32(len(next)),
		why: fmt.Sprintf("elastic: spare nodes again: %d of %d ranks", len(next), p.Full)}, true
}

// sparesLocked returns the registered nodes, in name order, that are
// not declared down and run none of placement's ranks; the caller holds
// c.mu.
func (c *Coordinator) sparesLocked(placement map[uint32]string) []string {
	used := map[string]bool{}
	for _, n := range placement {
		used[n] = true
	}
	var spares []string
	for _, n := range slices.Sorted(maps.Keys(c.state.Nodes)) {
		if !used[n] && !c.downLocked(n) {
			spares = append(spares, n)
		}
	}
	return spares
}

// growPlacement adds ranks to placement, numbered after its own, on the
// spare nodes in order, each taking as many as every node of placement
// runs, up to full ranks. It reports false when nothing is added: no
// spare, or nodes running uneven numbers of ranks (no size to give a new
// one).
func growPlacement(placement map[uint32]string, spares []string, full uint32) (map[uint32]string, bool) {
	per := map[string]uint32{}
	for _, n := range placement {
		per[n]++
	}
	k := uint32(0)
	for _, c := range per {
		if k != 0 && c != k {
			return nil, false
		}
		k = c
	}
	next := maps.Clone(placement)
	world := uint32(len(placement))
	for _, n := range spares {
		for range k {
			if world >= full {
				break
			}
			next[world] = n
			world++
		}
	}
	if world == uint32(len(placement)) {
		return nil, false
	}
	return next, true
}

// shrinkPlacement returns the placement of an elastic restart of a job
// placed on placement once the nodes down names are lost: each lost
// node's ranks go to a spare node (a live node running none of the job's
// ranks) while there is one, else are dropped; the ranks kept are
// numbered anew in their old order, each on the node it runs on. It
// reports false when no rank is dropped: spares hold them all.
func shrinkPlacement(placement map[uint32]string, down func(string) bool, spares []string) (map[uint32]string, bool) {
	lost := map[string]string{} // lost node -> the spare its ranks go to, "" to drop them
	dropped := false
	for _, r := range slices.Sorted(maps.Keys(placement)) {
		n := placement[r]
		if !down(n) {
			continue
		}
		if _, seen := lost[n]; seen {
			continue
		}
		if len(spares) > 0 {
			lost[n], spares = spares[0], spares[1:]
		} else {
			lost[n], dropped = "", true
		}
	}
	if !dropped {
		return nil, false
	}
	next := map[uint32]string{}
	for _, r := range slices.Sorted(maps.Keys(placement)) {
		n := placement[r]
		if to, ok := lost[n]; ok {
			if to == "" {
				continue
			}
			n = to
		}
		next[uint32(len(next))] = n
	}
	return next, true
}

func elasticKey(job string) []byte { return []byte("elastic/" + job) }

func (s *Store) putElastic(job string, p elasticPolicy) error {
	if p.Min == 0 {
		return s.db.Delete(elasticKey(job), pebble.Sync)
	}
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return s.db.Set(elasticKey(job), data, pebble.Sync)
}

// loadElastic reads every job's elastic setting.
func (s *Store) loadElastic() (map[string]elasticPolicy, error) {
	out := map[string]elasticPolicy{}
	err := s.scan("elastic/", func(key string, val []byte) error {
		var p elasticPolicy
		if err := json.Unmarshal(val, &p); err != nil {
			return fmt.Errorf("coordinator: loading %q: %w", key, err)
		}
		out[key[len("elastic/"):]] = p
		return nil
	})
	return out, err
}
