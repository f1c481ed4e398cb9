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

// Tier copy states, as TierCopy.state shows them.
const (
	tcCopying  = "copying"
	tcDurable  = "durable"
	tcFailed   = "failed"
	tcDeleting = "deleting"
)

// sharedNode is the node of a copy on a shared tier: every node reaches it.
const sharedNode = "-"

// tierCopy is a step's copy on one tier, persisted under tiercopy/.
type tierCopy struct {
	Job       string             `json:"job"`
	Step      int64              `json:"step"`
	Tier      string             `json:"tier"`
	State     string             `json:"state"`
	WorldSize uint32             `json:"world_size"`
	Holders   map[uint32]string  `json:"holders"`          // rank -> node that pushed it
	Done      map[uint32]uint64  `json:"done"`             // rank -> bytes, pushes that succeeded
	Failed    map[uint32]string  `json:"failed,omitempty"` // rank -> why its push failed
	Shards    []tiers.ShardEntry `json:"shards"`
	Manifests map[string]bool    `json:"manifests"` // node -> manifest written (or asked)
	Deletes   map[string]bool    `json:"deletes"`   // node -> deletion confirmed
	Error     string             `json:"error,omitempty"`
	Started   time.Time          `json:"started"`
	Finished  time.Time          `json:"finished"`
	// Rediscovered: rebuilt from manifests found on the tier, not made by
	// this index (rediscover.go); a node-local copy gains the nodes whose
	// manifests are found later.
	Rediscovered bool `json:"rediscovered,omitempty"`
}

type tierKey struct {
	job  string
	step int64
	tier string
}

func (tc *tierCopy) key() tierKey { return tierKey{tc.Job, tc.Step, tc.Tier} }

func (tc *tierCopy) proto() *coordpb.TierCopy {
	p := &coordpb.TierCopy{Tier: tc.Tier, State: tc.State, RanksDone: uint32(len(tc.Done)), Error: tc.Error,
		StartedUnixNano: tc.Started.UnixNano()}
	for _, n := range tc.Done {
		p.BytesDone += n
	}
	if !tc.Finished.IsZero() {
		p.DoneUnixNano = tc.Finished.UnixNano()
	}
	return p
}

// tierer schedules tier transfers. Lock order: tierer.mu, then
// Coordinator.mu.
type tierer struct {
	c    *Coordinator
	m    tierMetrics
	wake chan struct{} // poke: scan now

	mu       sync.Mutex
	closed   bool // the store is closing: stream handlers still ending change nothing
	nextID   uint64
	subs     map[string]*subscriber           // node -> its open order stream
	copies   map[tierKey]*tierCopy            // every tier copy known
	orders   map[uint64]*order                // sent or waiting, not yet reported
	policies map[string]tiers.Policy          // per job; absent: the default
	last     map[string]time.Time             // job/tier -> when its last copy started
	lastStep map[string]int64                 // job/tier -> the step of that copy
	health   map[string][]*coordpb.TierHealth // node -> its tiers
	skipped  map[string]bool                  // job/tier warned about a missing tier

	commits      chan commitRec        // primary commits to replicate (replicate.go)
	rankRepl     map[rankKey]int       // replica orders in flight per rank
	rankNext     map[rankKey]commitRec // per rank, the newest commit waiting for them
	commitOrders map[uint64]rankKey    // replica order -> its rank

	jobReplicas map[string]int          // per job; absent: the default
	replicated  map[string]int64        // job -> newest step replicated
	repl        map[string]*replication // job -> replication in flight

	rd *rediscovery // tier copies rebuilt from the tiers' manifests (rediscover.go)

	gangs      map[string]*gangRecord // job -> its last gang order (gang.go)
	unfinished map[string]int64       // job -> step: a gang an agent holds broken, no recovery of it known here (gang.go)
	seen       map[string]bool        // nodes whose agent opened an order stream since this coordinator began to lead (unfinished.go)
}

// order is a transfer order and the node it is for.
type order struct {
	node string
	o    *coordpb.TransferOrder
	sent bool
}

// subscriber is an agent's open Transfers stream.
type subscriber struct {
	tiers []string
	wake  chan struct{} // orders are waiting
	done  chan struct{} // closed when a newer stream replaces this one
}

func (s *subscriber) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func newTierer(c *Coordinator) *tierer {
	return &tierer{c: c, wake: make(chan struct{}, 1), subs: map[string]*subscriber{}, copies: map[tierKey]*tierCopy{}, orders: map[uint64]*order{},
		policies: map[string]tiers.Policy{}, last: map[string]time.Time{}, lastStep: map[string]int64{},
		health: map[string][]*coordpb.TierHealth{}, skipped: map[string]bool{},
		commits: make(chan commitRec, 1<<16), rankRepl: map[rankKey]int{}, rankNext: map[rankKey]commitRec{}, commitOrders: map[uint64]rankKey{},
		jobReplicas: map[string]int{}, replicated: map[string]int64{}, repl: map[string]*replication{}, rd: newRediscovery(),
		gangs: map[string]*gangRecord{}, unfinished: map[string]int64{}, seen: map[string]bool{}}
}

// policy returns a job's tier policy.
func (t *tierer) policy(job string) tiers.Policy {
	if p, ok := t.policies[job]; ok {
		return p
	}
	return t.c.cfg.Policy
}

// inFlight reports whether a step of job is being copied to a tier.
func (t *tierer) inFlight(job string) bool {
	for _, tc := range t.copies {
		if tc.Job == job && tc.State == tcCopying {
			return true
		}
	}
	return false
}

// scan starts copies of newly consistent steps that their policy makes
// due. It runs on a short tick and whenever a step becomes consistent.
func (t *tierer) scan() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	now := t.c.cfg.Clock.Now()
	type due struct {
		job    string
		step   int64
		holder map[uint32]string
		shards []tiers.ShardEntry
		ws     uint32
	}
	var todo []due
	t.c.mu.Lock()
	for id, j := range t.c.state.Jobs {
		t.replicate(j)
		if j.Latest < 0 || !t.anyDue(id, j.Latest, now) || t.inFlight(id) {
			continue
		}
		st := j.Steps[j.Latest]
		if st == nil || st.State != Consistent {
			continue
		}
		d := due{job: id, step: j.Latest, holder: map[uint32]string{}, ws: st.WorldSize}
		for r := range st.WorldSize {
			for _, cp := range st.Copies[r] {
				if cp.Tier == "shm" && cp.State == "committed" {
					d.holder[r] = cp.Node
					d.shards = append(d.shards, tiers.ShardEntry{Rank: r, Size: int64(cp.Size), HeaderChecksum: cp.Sum})
					break
				}
			}
		}
		if len(d.holder) == int(st.WorldSize) { // else: only on tiers already
			todo = append(todo, d)
		}
	}
	t.c.mu.Unlock()
	for _, d := range todo {
		for _, tp := range t.policy(d.job).Tiers {
			if !t.due(d.job, tp, d.step, now) || !t.reachable(d.job, tp.Tier, d.holder) || !t.listed(d.job, d.step, tp.Tier, d.holder) {
				continue
			}
			t.start(&tierCopy{Job: d.job, Step: d.step, Tier: tp.Tier, State: tcCopying, WorldSize: d.ws,
				Holders: d.holder, Done: map[uint32]uint64{}, Failed: map[uint32]string{}, Shards: d.shards, Manifests: map[string]bool{},
				Deletes: map[string]bool{}, Started: now})
		}
	}
}

// due reports whether step of job goes to tp's tier now. A step is
// re-evaluated on every scan until it is copied, so a time-based tier
// takes the last step of a job that stopped once the time has come, and a
// tier a node could not write is tried again once it can.
func (t *tierer) due(job string, tp tiers.TierPolicy, step int64, now time.Time) bool {
	k := job + "/" + tp.Tier
	last, ok := t.lastStep[k]
	if !ok {
		last = -1
	}
	return tp.Due(step, last, t.last[k], now)
}

func (t *tierer) anyDue(job string, step int64, now time.Time) bool {
	for _, tp := range t.policy(job).Tiers {
		if t.due(job, tp, step, now) {
			return true
		}
	}
	return false
}

// reachable reports whether every node holding a shard can write tier.
func (t *tierer) reachable(job, tier string, holder map[uint32]string) bool {
	for _, node := range holder {
		s := t.subs[node]
		if s == nil || !slices.Contains(s.tiers, tier) {
			k := job + "/" + tier
			if !t.skipped[k] {
				t.skipped[k] = true
				t.c.log.Warn("tier due but a node holding shards cannot write it; waiting until it can",
					"job", job, "tier", tier, "node", node, "connected", s != nil)
				t.m.skipped.WithLabelValues(tier).Inc()
			}
			return false
		}
	}
	delete(t.skipped, job+"/"+tier)
	return true
}

// start records a copy and orders its pushes.
func (t *tierer) start(tc *tierCopy) {
	k := tc.Job + "/" + tc.Tier
	t.last[k], t.lastStep[k] = tc.Started, tc.Step
	t.copies[tc.key()] = tc
	t.persist(tc)
	for _, r := range slices.Sorted(maps.Keys(tc.Holders)) {
		t.send(tc.Holders[r], &coordpb.TransferOrder{Kind: "push", Job: tc.Job, Step: tc.Step, Tier: tc.Tier, Rank: r, WorldSize: tc.WorldSize})
	}
	t.c.log.Info("tier copy started", "job", tc.Job, "step", tc.Step, "tier", tc.Tier, "ranks", len(tc.Holders))
}

// send queues an order for node and wakes its stream.
func (t *tierer) send(node string, o *coordpb.TransferOrder) {
	t.nextID++
	o.Id = t.nextID
	t.orders[o.Id] = &order{node: node, o: o}
	if s := t.subs[node]; s != nil {
		s.poke()
	}
}

// persist writes a tier copy's record; a failure is logged: the copy is
// redone at a later step, never trusted without its record.
func (t *tierer) persist(tc *tierCopy) {
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
	if tiers.TierNodeLocal(tc.Tier) {
		return tc.Holders[rank]
	}
	return sharedNode
}

func (tc *tierCopy) String() string {
	return fmt.Sprintf("%s step %d on %s", tc.Job, tc.Step, tc.Tier)
}

// close stops every change: the coordinator is shutting down, and stream
// handlers ending after it must not touch the store.
func (t *tierer) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}
