package coordinator

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/tiers"
)

// Tiering: the coordinator decides which consistent steps go to which
// durable tier, the agents move the bytes. For a step due on a tier, every
// node holding a rank's shard in shared memory is ordered to push it; once
// every push has succeeded, the manifest is written (on a node-local tier
// by every node, naming its ranks; on a shared tier by one node), and only
// then is the step durable on that tier and its tier copies enter the
// index as restore sources. Retention then removes the tier's copies the
// policy no longer keeps, manifest first.
//
// At most one step of a job is in flight to the tiers at a time: an agent
// gives a save a spare segment while a transfer reads the previous one, so
// this bounds a node's shared memory to one segment per rank beyond its
// slots. A step that comes due while another is in flight is skipped; the
// next consistent step takes its place.

// tierCopyState is where a tier copy stands (the labels of
// coordpb.TierCopyState, as its record stores them).
type tierCopyState string

// The tier copy states.
const (
	tcCopying  tierCopyState = "copying"
	tcDurable  tierCopyState = "durable"
	tcFailed   tierCopyState = "failed"
	tcDeleting tierCopyState = "deleting"
)

func (s tierCopyState) proto() coordpb.TierCopyState {
	switch s {
	case tcCopying:
		return coordpb.TierCopyState_TIER_COPY_STATE_COPYING
	case tcDurable:
		return coordpb.TierCopyState_TIER_COPY_STATE_DURABLE
	case tcFailed:
		return coordpb.TierCopyState_TIER_COPY_STATE_FAILED
	case tcDeleting:
		return coordpb.TierCopyState_TIER_COPY_STATE_DELETING
	}
	return coordpb.TierCopyState_TIER_COPY_STATE_UNSPECIFIED
}

// sharedNode is the node of a copy on a shared tier: every node reaches it.
const sharedNode = "-"

// tierCopy is a step's copy on one tier, persisted under tiercopy/.
type tierCopy struct {
	Job       string             `json:"job"`
	Step      int64              `json:"step"`
	Tier      string             `json:"tier"`
	State     tierCopyState      `json:"state"`
	WorldSize uint32             `json:"world_size"`
	Holders   map[uint32]string  `json:"holders"`          // rank -> node that pushed it
	Done      map[uint32]uint64  `json:"done"`             // rank -> bytes, pushes that succeeded
	Failed    map[uint32]string  `json:"failed,omitempty"` // rank -> why its push failed
	Shards    []tiers.ShardEntry `json:"shards"`
	Manifests map[string]bool    `json:"manifests"` // node -> manifest written (or asked)
	Deletes   map[string]bool    `json:"deletes"`   // node -> deletion confirmed
	Error     string             `json:"error,omitempty"`
	// Corrupt: rank -> why, for shards of a durable copy found corrupt on
	// a restore's fetch or by rewind verify (tiercorrupt.go).
	Corrupt  map[uint32]string `json:"corrupt,omitempty"`
	Started  time.Time         `json:"started"`
	Finished time.Time         `json:"finished"`
	// Rediscovered: rebuilt from manifests found on the tier, not made by
	// this index (rediscover.go); a node-local copy gains the nodes whose
	// manifests are found later.
	Rediscovered bool `json:"rediscovered,omitempty"`
}

// partial reports whether a copy rebuilt from manifests (rediscover.go)
// lacks some ranks' shards still: a node-local copy grows with each
// node's listing, and a node that holds some never came back. It is no
// durable copy of the step until then: shown as copying, not counted by
// retention or as a tier's recovery point.
func (tc *tierCopy) partial() bool {
	return tc.Rediscovered && tc.State == tcDurable && len(tc.Done) < int(tc.WorldSize)
}

type tierKey struct {
	job  string
	step int64
	tier string
}

func (tc *tierCopy) key() tierKey { return tierKey{tc.Job, tc.Step, tc.Tier} }

func (tc *tierCopy) proto() *coordpb.TierCopy {
	p := &coordpb.TierCopy{Tier: tc.Tier, State: tc.State.proto(), RanksDone: uint32(len(tc.Done)), Error: tc.Error,
		StartedUnixNano: tc.Started.UnixNano()}
	if tc.State == tcDurable && len(tc.Corrupt) > 0 {
		p.State, p.Error = coordpb.TierCopyState_TIER_COPY_STATE_CORRUPT, tc.corruptText()
	}
	if tc.partial() {
		p.State = coordpb.TierCopyState_TIER_COPY_STATE_COPYING
		p.Error = fmt.Sprintf("rediscovered: %d of %d ranks' shards found so far; the listings of the nodes holding the others are awaited", len(tc.Done), tc.WorldSize)
	}
	for _, n := range tc.Done {
		p.BytesDone += n
	}
	if !tc.Finished.IsZero() {
		p.DoneUnixNano = tc.Finished.UnixNano()
	}
	return p
}

// tiering schedules the copies of consistent steps to the durable tiers
// and removes those retention no longer keeps; it owns every tier copy's
// record and the rediscovery of copies from the tiers' manifests. Its
// orders go through the order streams (orders.go), whose outcomes it
// claims. Lock order: tiering.mu, then Coordinator.mu, then the order
// streams' lock.
type tiering struct {
	c    *Coordinator
	m    *tierMetrics
	wake chan struct{} // poke: scan now

	mu       sync.Mutex
	closed   bool                    // the store is closing: stream handlers still ending change nothing
	copies   map[tierKey]*tierCopy   // every tier copy known
	policies map[string]tiers.Policy // per job; absent: the default
	last     map[string]time.Time    // job/tier -> when its last copy started
	lastStep map[string]int64        // job/tier -> the step of that copy
	skipped  map[string]bool         // job/tier warned about a missing tier

	rd *rediscovery // tier copies rebuilt from the tiers' manifests (rediscover.go)

	// dueListed, when set (by tests), is called by a scan once it has
	// listed the due steps and let go of the index lock.
	dueListed func()
}

func newTiering(c *Coordinator, m *tierMetrics) *tiering {
	return &tiering{c: c, m: m, wake: make(chan struct{}, 1), copies: map[tierKey]*tierCopy{},
		policies: map[string]tiers.Policy{}, last: map[string]time.Time{}, lastStep: map[string]int64{},
		skipped: map[string]bool{}, rd: newRediscovery()}
}

// policy returns a job's tier policy.
func (t *tiering) policy(job string) tiers.Policy {
	if p, ok := t.policies[job]; ok {
		return p
	}
	return t.c.cfg.Policy
}

// inFlight reports whether a step of job is being copied to a tier.
func (t *tiering) inFlight(job string) bool {
	for _, tc := range t.copies {
		if tc.Job == job && tc.State == tcCopying {
			return true
		}
	}
	return false
}

// scan starts copies of newly consistent steps that their policy makes
// due. It runs on a short tick and whenever a step becomes consistent.
func (t *tiering) scan() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	now := t.c.cfg.Clock.Now()
	due := t.dueSteps(now)
	if t.dueListed != nil {
		t.dueListed()
	}
	for _, d := range due {
		for _, tp := range t.policy(d.job).Tiers {
			tier := string(tp.Tier)
			if !t.due(d.job, tp, d.step, now) || !t.reachable(d.job, tier, d.nodes) || !t.listed(d.job, d.step, tier, d.nodes) {
				continue
			}
			holder, shards, nodes, ok := t.holdersOf(d)
			if !ok {
				break // the step changed meanwhile: the next scan sees it
			}
			// The index lock was let go since dueSteps: a rank's copy may
			// have moved to a node not checked yet.
			if !slices.Equal(nodes, d.nodes) && (!t.reachable(d.job, tier, nodes) || !t.listed(d.job, d.step, tier, nodes)) {
				continue
			}
			t.start(&tierCopy{Job: d.job, Step: d.step, Tier: tier, State: tcCopying, WorldSize: d.ws,
				Holders: holder, Done: map[uint32]uint64{}, Failed: map[uint32]string{}, Shards: shards, Manifests: map[string]bool{},
				Deletes: map[string]bool{}, Started: now})
		}
	}
}

// dueStep is a job's latest consistent step that some tier may take now,
// with the nodes holding its shards in memory.
type dueStep struct {
	job   string
	step  int64
	ws    uint32
	nodes []string // each holding node, once per run of ranks it holds
}

// dueSteps lists the latest consistent steps that a tier policy makes due
// and whose every rank is in some node's memory (a step only on tiers
// already is not copied again). It runs on every scan, under the index
// lock, so it keeps what it builds to one entry per run of a node's ranks:
// the holders and the manifest are made only for a copy that starts. The
// caller holds t.mu.
func (t *tiering) dueSteps(now time.Time) []dueStep {
	var out []dueStep
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for id, j := range t.c.state.Jobs {
		if j.Latest < 0 || !t.anyDue(id, j.Latest, now) || t.inFlight(id) {
			continue
		}
		st := j.Steps[j.Latest]
		if st == nil || st.State != Consistent {
			continue
		}
		d := dueStep{job: id, step: j.Latest, ws: st.WorldSize}
		whole := true
		for r := range st.WorldSize {
			cp := memoryCopy(st, r)
			if cp == nil {
				whole = false
				break
			}
			if n := len(d.nodes); n == 0 || d.nodes[n-1] != cp.Node {
				d.nodes = append(d.nodes, cp.Node)
			}
		}
		if whole {
			out = append(out, d)
		}
	}
	return out
}

// memoryCopy returns the first committed copy of rank's shard in a node's
// memory, or nil.
func memoryCopy(st *Step, rank uint32) *Copy {
	for _, cp := range st.Copies[rank] {
		if cp.Tier == "shm" && cp.State == CopyCommitted {
			return cp
		}
	}
	return nil
}

// holdersOf returns, for a tier copy of d's step that starts now, the
// node pushing each rank's shard, the manifest's entries and the holding
// nodes as dueSteps lists them; false when the step is no longer
// consistent at d's world size with every rank in memory. The caller
// holds t.mu.
func (t *tiering) holdersOf(d dueStep) (map[uint32]string, []tiers.ShardEntry, []string, bool) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	j := t.c.state.Jobs[d.job]
	if j == nil {
		return nil, nil, nil, false
	}
	st := j.Steps[d.step]
	if st == nil || st.State != Consistent || st.WorldSize != d.ws {
		return nil, nil, nil, false
	}
	holder := make(map[uint32]string, st.WorldSize)
	shards := make([]tiers.ShardEntry, 0, st.WorldSize)
	var nodes []string
	for r := range st.WorldSize {
		cp := memoryCopy(st, r)
		if cp == nil {
			return nil, nil, nil, false
		}
		holder[r] = cp.Node
		shards = append(shards, tiers.ShardEntry{Rank: r, Size: int64(cp.Size), HeaderChecksum: cp.Sum})
		if n := len(nodes); n == 0 || nodes[n-1] != cp.Node {
			nodes = append(nodes, cp.Node)
		}
	}
	return holder, shards, nodes, true
}

// due reports whether step of job goes to tp's tier now. A step is
// re-evaluated on every scan until it is copied, so a time-based tier
// takes the last step of a job that stopped once the time has come, and a
// tier a node could not write is tried again once it can.
func (t *tiering) due(job string, tp tiers.TierPolicy, step int64, now time.Time) bool {
	k := job + "/" + string(tp.Tier)
	last, ok := t.lastStep[k]
	if !ok {
		last = -1
	}
	return tp.Due(step, last, t.last[k], now)
}

func (t *tiering) anyDue(job string, step int64, now time.Time) bool {
	for _, tp := range t.policy(job).Tiers {
		if t.due(job, tp, step, now) {
			return true
		}
	}
	return false
}

// reachable reports whether every node holding a shard can write tier.
func (t *tiering) reachable(job, tier string, nodes []string) bool {
	for _, node := range nodes {
		names, connected := t.c.streams.tiersOf(node)
		if !slices.Contains(names, tier) {
			k := job + "/" + tier
			if !t.skipped[k] {
				t.skipped[k] = true
				t.c.log.Warn("tier due but a node holding shards cannot write it; waiting until it can",
					"job", job, "tier", tier, "node", node, "connected", connected)
				t.m.skipped.WithLabelValues(tier).Inc()
			}
			return false
		}
	}
	delete(t.skipped, job+"/"+tier)
	return true
}

// start records a copy and orders its pushes.
func (t *tiering) start(tc *tierCopy) {
	k := tc.Job + "/" + tc.Tier
	t.last[k], t.lastStep[k] = tc.Started, tc.Step
	t.copies[tc.key()] = tc
	t.persist(tc)
	for _, r := range slices.Sorted(maps.Keys(tc.Holders)) {
		t.send(tc.Holders[r], &coordpb.TransferOrder{Job: tc.Job, Step: tc.Step, Order: &coordpb.TransferOrder_Push{Push: &coordpb.PushOrder{
			Tier: tc.Tier, Rank: r, WorldSize: tc.WorldSize}}})
	}
	t.c.log.Info("tier copy started", "job", tc.Job, "step", tc.Step, "tier", tc.Tier, "ranks", len(tc.Holders))
}

// send queues an order for node.
func (t *tiering) send(node string, o *coordpb.TransferOrder) { t.c.streams.send(node, o) }

// persist writes a tier copy's record; a failure is logged: the copy is
// redone at a later step, never trusted without its record.
func (t *tiering) persist(tc *tierCopy) {
	if t.closed {
		return
	}
	if err := t.c.store.putTierCopy(tc); err != nil {
		t.c.log.Error("persisting tier copy", "job", tc.Job, "step", tc.Step, "tier", tc.Tier, "err", err)
	}
}

// nodesOf returns the nodes holding a copy's shards and their ranks.
func (tc *tierCopy) nodesOf() map[string][]uint32 {
	out := map[string][]uint32{}
	for r, n := range tc.Holders {
		out[n] = append(out[n], r)
	}
	for n := range out {
		slices.Sort(out[n])
	}
	return out
}

// shardsProto lists the manifest entries.
func (tc *tierCopy) shardsProto() []*coordpb.ShardEntry {
	out := make([]*coordpb.ShardEntry, len(tc.Shards))
	for i, s := range tc.Shards {
		out[i] = &coordpb.ShardEntry{Rank: s.Rank, SizeBytes: uint64(s.Size), HeaderChecksum: s.HeaderChecksum}
	}
	return out
}

// copyNode is the node a tier copy of rank's shard is recorded on.
func (tc *tierCopy) copyNode(rank uint32) string {
	if tiers.Name(tc.Tier).NodeLocal() {
		return tc.Holders[rank]
	}
	return sharedNode
}

func (tc *tierCopy) String() string {
	return fmt.Sprintf("%s step %d on %s", tc.Job, tc.Step, tc.Tier)
}

// close stops every change: the coordinator is shutting down, and stream
// handlers ending after it must not touch the store.
func (t *tiering) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}
