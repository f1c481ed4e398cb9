package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/transport"
)

// Coordinator is the running coordinator: the index, its store and the
// agents it knows. Operations on the index are serialized by mu; a change
// is persisted (synced when it decides a state) before the caller is
// answered.
type Coordinator struct {
	cfg         Config
	log         *slog.Logger
	incarnation atomic.Value // string; changes when the index loses acknowledged writes
	metrics     *metrics
	jobs        *jobMetrics // per-job gauges and recoveries (jobmetrics.go)
	authz       *transport.Authorizer
	audit       *auditLog // the audit log, in the store (audit.go)
	auditor     *transport.Audit

	mu    sync.Mutex
	state *State
	store *Store
	down  map[string]time.Time // nodes declared dead, since when (recovery.go)
	// detectedDown are the nodes of down that failure detection declared
	// dead (not an operator): one that answers a direct ping is back.
	detectedDown map[string]bool
	stalled      map[string]stalledRecovery // jobs whose recovery waits for a node (retry.go)
	retrying     map[string]*failedRecovery // jobs whose recovery failed, tried again (retry.go)
	alive        map[string]aliveNode       // per node not down: ends the calls to it at its death (ops.go)
	reganged     map[string]time.Time       // per job: when its last re-gang ended (recovery.go)
	// retryFired, when set (by tests, before the retry is scheduled), is
	// called by a retry whose backoff ended, before it waits for the
	// job's lock (retry.go).
	retryFired func(job string)
	dropping   map[droppedKey]bool // dropped ranks' copies being deleted (dropranks.go)
	// bg counts the background work Close waits for (dropranks.go),
	// started under mu while closing is false; bgCtx ends at Close.
	bg      sync.WaitGroup
	bgCtx   context.Context
	bgStop  context.CancelFunc
	closing bool
	// rebuild is the catching up with the answers given before this
	// coordinator (rebuild.go); followed is set by a call refused while
	// it did not lead, so that the next lead starts a catching up.
	rebuild  rebuild
	followed atomic.Bool

	recovering map[string]*sync.Mutex // per job: one recovery at a time
	watchers   watchers               // WatchJob streams
	members    atomic.Value           // *membership.Members, with Config.Gossip

	// The parts that send orders on the agents' order streams, each
	// under its own lock (transfers.go).
	streams     *orderStreams // the agents' order streams (orders.go)
	tiers       *tiering      // tier copies and retention (tiering.go)
	replication *replication  // replicas in peers' memory (replicate.go)
	gangs       *gangs        // gang orders (gang.go)
	elastic     elasticJobs   // jobs' minimum world sizes (elastic.go)
	suspects    *suspects     // tier copies nodes report corrupt, being checked (tiersuspect.go)

	// qmu guards queue, the reports waiting to be applied (group.go).
	qmu   sync.Mutex
	queue []*pendingReport
	// groupCopies is the copy list applyGroup reuses, under mu: a burst of
	// reports then makes no garbage of it.
	groupCopies []CopyKey
}

type metrics struct {
	reports        *prometheus.CounterVec
	fenced         prometheus.Counter
	droppedFreed   prometheus.Counter
	consistent     prometheus.Counter
	commitToConsis prometheus.Histogram
}

// New opens the store, loads the index and returns a coordinator.
func New(cfg Config) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	store, err := OpenStore(cfg.DataDir, cfg.Logger.With("component", "pebble"))
	if err != nil {
		return nil, err
	}
	c := &Coordinator{
		cfg:   cfg,
		log:   cfg.Logger.With("component", "coordinator"),
		state: cfg.newState(),
		store: store,
		down:  map[string]time.Time{},
	}
	c.bgCtx, c.bgStop = context.WithCancel(context.Background())
	c.incarnation.Store(newIncarnation())
	start := time.Now()
	if err := store.Load(c.state); err != nil {
		store.Close()
		return nil, err
	}
	c.metrics = newMetrics(cfg.Registry, c)
	c.jobs = newJobMetrics(cfg.Registry, c)
	if err := c.initTransport(); err != nil {
		store.Close()
		return nil, err
	}
	tm := c.registerTierMetrics(cfg.Registry)
	c.streams, c.tiers, c.replication, c.gangs = newOrderStreams(), newTiering(c, tm), newReplication(c, tm), newGangs(c)
	c.suspects = newSuspects()
	copies, policies, replicas, err := store.loadTiering()
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("coordinator: loading tier copies: %w", err)
	}
	c.replication.load(replicas)
	if c.elastic.jobs, err = store.loadElastic(); err != nil {
		store.Close()
		return nil, err
	}
	c.tiers.load(copies, policies)
	c.startRebuild(false)
	c.log.Info("index loaded", "jobs", len(c.state.Jobs), "nodes", len(c.state.Nodes),
		"took", time.Since(start).Round(time.Millisecond), "incarnation", c.Incarnation())
	return c, nil
}

func newMetrics(reg prometheus.Registerer, c *Coordinator) *metrics {
	m := &metrics{
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rewind_coordinator_shard_reports_total",
			Help: "Shard events reported by agents, by state and result.",
		}, []string{"state", "result"}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rewind_coordinator_fenced_reports_total",
			Help: "Committed copies refused because a rank of an epoch the job has left saved them (a fenced gang).",
		}),
		droppedFreed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rewind_coordinator_dropped_rank_copies_freed_total",
			Help: "Copies in memory of rank numbers a job no longer has (it shrank) deleted once its protected step is at its new world size.",
		}),
		consistent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rewind_coordinator_consistent_steps_total",
			Help: "Steps that became consistent (every rank committed).",
		}),
		commitToConsis: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rewind_coordinator_commit_seconds",
			Help:    "Time to record a report that makes a step consistent, sync included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	countSteps := func(want func(*Step) bool) func() float64 {
		return func() float64 {
			c.mu.Lock()
			defer c.mu.Unlock()
			n := 0
			for _, j := range c.state.Jobs {
				for _, st := range j.Steps {
					if want(st) {
						n++
					}
				}
			}
			return float64(n)
		}
	}
	var steps []prometheus.Collector
	for _, state := range []StepState{Partial, Consistent, Abandoned} {
		steps = append(steps, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "rewind_coordinator_steps",
			Help:        "Steps in the index, by state.",
			ConstLabels: prometheus.Labels{"state": string(state)},
		}, countSteps(func(st *Step) bool { return st.State == state })))
	}
	steps = append(steps, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rewind_coordinator_unrestorable_steps",
		Help: "Steps a restore could not bring back whole (some rank had no copy that served); automatic restores pass over them.",
	}, countSteps(func(st *Step) bool { return st.Unrestorable != nil })))
	reg.MustRegister(append(steps, m.reports, m.fenced, m.droppedFreed, m.consistent, m.commitToConsis)...)
	return m
}

// Close closes the store.
func (c *Coordinator) Close() error {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.bgStop()
	c.bg.Wait()
	c.streams.shutdown()
	c.tiers.close()
	c.replication.close()
	c.audit.close()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.store.Close()
}

// apply runs f on the index under the lock and persists what it changed.
func (c *Coordinator) apply(f func(ch *Changes) error) (*Changes, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ch Changes
	ferr := f(&ch)
	if err := c.persist(&ch); err != nil {
		return nil, err
	}
	return &ch, ferr
}

// persist writes ch to the store (synced when it decides a state); the
// caller holds c.mu. If the write fails, the coordinator reloads its index
// from the store so memory never claims what disk does not hold.
func (c *Coordinator) persist(ch *Changes) error {
	if err := c.store.Write(ch); err != nil {
		return c.reload(err)
	}
	for _, b := range ch.Back {
		// An index that was behind the agents (a restart, a standby
		// taking over) drops what they no longer hold before it answers:
		// only going back below an answer is news (DESIGN invariant 9
		// allows it when a node is lost with its shards).
		lvl := slog.LevelDebug
		if b.To < b.Answered {
			lvl = slog.LevelWarn
		}
		c.log.Log(context.Background(), lvl, "a job's latest consistent step went back", "job", b.Job, "from", b.From, "to", b.To, "answered", b.Answered, "why", b.Why)
	}
	return nil
}

// reload makes the index in memory what the store holds, after a change
// applied in memory was not stored (err, which it returns wrapped): no
// answer may tell what a crash would take back (DESIGN invariant 9). A
// step made consistent in memory only would otherwise be answered from
// there, and the agent's report sent again would find its commit known
// and decide nothing, so nothing would ever store it. Grouped writes
// acknowledged earlier are dropped with the change: a new incarnation
// makes every agent register its inventory again. The caller holds c.mu.
func (c *Coordinator) reload(err error) error {
	c.store.Discard()
	c.incarnation.Store(newIncarnation())
	c.log.Error("index change not stored; reloading the index, agents will re-register", "err", err)
	fresh := c.cfg.newState()
	if lerr := c.store.Load(fresh); lerr != nil {
		c.log.Error("reloading the index", "err", lerr)
	} else {
		for id, j := range fresh.Jobs { // what was told stays told
			if old := c.state.Jobs[id]; old != nil {
				j.answered = old.answered
			}
		}
		c.state = fresh
	}
	return fmt.Errorf("coordinator: %w", err)
}

// flushEvery is how often grouped index writes are committed when no
// deciding write commits them sooner.
const flushEvery = 50 * time.Millisecond

// flush commits grouped index writes.
func (c *Coordinator) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.store.Flush(); err != nil {
		_ = c.reload(fmt.Errorf("flushing index writes: %w", err))
	}
}

// Incarnation identifies this run of the coordinator.
func (c *Coordinator) Incarnation() string { return c.incarnation.Load().(string) }

func newIncarnation() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
