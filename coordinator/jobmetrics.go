package coordinator

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/api/coordpb"
)

// Per-job metrics, the operator's view of where each job stands: how old
// its newest checkpoint is at each level (consistent, in two nodes'
// memory, durable on each tier), how large a step is, its recoveries and
// the work they cost. The gauges are computed from the index when
// scraped, on the coordinator's clock; only the leader reports them (a
// follower's index is not the cluster's).
//
// The job label is job_id, not job: Prometheus gives every target a job
// label of its own (the scrape job), and a metric's job label would be
// renamed exported_job at scrape.

// recoveryBuckets cover a recovery phase from 10 ms to about 80 s.
var recoveryBuckets = prometheus.ExponentialBuckets(0.01, 2, 14)

// jobMetrics holds the per-job metrics, and what the recoveries left to
// measure: the restart of a re-ganged job ends when its new gang makes
// its first step consistent.
type jobMetrics struct {
	c      *Coordinator
	phases *prometheus.HistogramVec

	latest, consistentAge, protectedAge, replicationLag *prometheus.Desc
	recoveryPointAge, tierLag, stepBytes, epoch, lost   *prometheus.Desc
	worldSize, recoveries                               *prometheus.Desc
	leader, nodeDegraded                                *prometheus.Desc

	// mu guards what follows. Lock order: c.mu, then mu.
	mu      sync.Mutex
	lostSec map[string]float64        // job -> work lost to recoveries, seconds
	regangs map[string]*[2]float64    // job -> re-gangs that succeeded, failed
	pending map[string]*restartWatch  // job -> a re-gang waiting for its first step
	bytes   map[string]stepBytesCache // job -> its latest step's bytes
}

// restartWatch is a re-gang whose new gang has not yet made a step
// consistent.
type restartWatch struct {
	step     int64         // the step it resumed from
	epoch    uint64        // the new gang's epoch
	restored time.Time     // when every rank was restored
	from     time.Time     // when the resumed step had been consistent
	perStep  time.Duration // the job's time per step before the failure; 0 unknown
}

type stepBytesCache struct {
	step  int64
	bytes uint64
}

func newJobMetrics(reg prometheus.Registerer, c *Coordinator) *jobMetrics {
	job := []string{"job_id"}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	m := &jobMetrics{
		c: c,
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rewind_job_recovery_phase_seconds",
			Help:    "Duration of each phase of a job's re-gang: plan (node declared dead to restore planned), restore (planned to every rank restored), restart (restored to the new gang's first consistent step).",
			Buckets: recoveryBuckets,
		}, []string{"job_id", "phase"}),
		latest:           desc("rewind_job_latest_step", "The job's newest consistent step (every rank committed, restorable).", job...),
		consistentAge:    desc("rewind_job_consistent_age_seconds", "Seconds since the job's newest consistent step became consistent.", job...),
		protectedAge:     desc("rewind_job_protected_age_seconds", "Seconds since the job's newest step held in two nodes' memory (surviving the loss of any one node) became consistent.", job...),
		replicationLag:   desc("rewind_job_replication_lag_seconds", "How far the newest step in two nodes' memory trails the newest consistent step, in seconds of their consistency times.", job...),
		recoveryPointAge: desc("rewind_job_recovery_point_age_seconds", "The recovery point on each durable tier: seconds since the job's newest step with a durable copy on the tier became consistent.", "job_id", "tier"),
		tierLag:          desc("rewind_job_tier_lag_seconds", "How far the newest durable copy on each tier trails the newest consistent step, in seconds of their consistency times.", "job_id", "tier"),
		stepBytes:        desc("rewind_job_step_bytes", "Bytes of the job's newest consistent step, over all ranks (one copy each).", job...),
		worldSize:        desc("rewind_job_world_size", "The job's number of ranks.", job...),
		recoveries:       desc("rewind_job_recoveries_total", "Re-gangs of the job (a node lost, or an operator's restart) since this coordinator started, by result (ok, failed); 0 from the job's first step, so that increase() sees the first one.", "job_id", "result"),
		epoch:            desc("rewind_job_epoch", "The job's gang generation, raised by each re-gang or restore.", job...),
		lost:             desc("rewind_job_lost_seconds_total", "Wall time lost to re-gangs: from the resumed step's consistency to the new gang's first consistent step, less the time its steps since take without a failure (the job's time per step before it).", job...),
		leader:           desc("rewind_coordinator_leader", "1 while this coordinator leads (serves and reports the per-job metrics), else 0."),
		nodeDegraded:     desc("rewind_coordinator_node_tier_degraded", "1 while a node's transfers to a tier fail and are retried, as the node last reported, else 0.", "node", "tier"),
		lostSec:          map[string]float64{},
		regangs:          map[string]*[2]float64{},
		pending:          map[string]*restartWatch{},
		bytes:            map[string]stepBytesCache{},
	}
	reg.MustRegister(m.phases, m)
	return m
}

// Describe sends the descriptions of the gauges computed when scraped.
func (m *jobMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.latest, m.consistentAge, m.protectedAge, m.replicationLag,
		m.recoveryPointAge, m.tierLag, m.stepBytes, m.epoch, m.lost, m.worldSize, m.recoveries, m.leader, m.nodeDegraded} {
		ch <- d
	}
}

// jobSnap is what a scrape reads of one job under c.mu.
type jobSnap struct {
	id                    string
	latest, protected     int64
	latestAt, protectedAt time.Time
	worldSize             uint32
	epoch                 uint64
	durable               map[string]time.Time // tier -> when its newest durable step was consistent
}

// Collect computes the gauges from the index.
func (m *jobMetrics) Collect(ch chan<- prometheus.Metric) {
	c := m.c
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	leading := c.leading()
	gauge(m.leader, map[bool]float64{true: 1, false: 0}[leading])
	c.streams.eachNodeHealth(func(node string, h *coordpb.TierHealth) {
		gauge(m.nodeDegraded, map[bool]float64{true: 1, false: 0}[h.Degraded], node, h.Tier)
	})
	if !leading {
		return
	}
	now := c.cfg.Clock.Now()
	for _, j := range m.snapshot() {
		if j.latest < 0 || j.latestAt.IsZero() {
			continue
		}
		gauge(m.latest, float64(j.latest), j.id)
		gauge(m.epoch, float64(max(j.epoch, 1)), j.id)
		gauge(m.worldSize, float64(j.worldSize), j.id)
		gauge(m.consistentAge, age(now, j.latestAt), j.id)
		if j.protected >= 0 && !j.protectedAt.IsZero() {
			gauge(m.protectedAge, age(now, j.protectedAt), j.id)
			gauge(m.replicationLag, j.latestAt.Sub(j.protectedAt).Seconds(), j.id)
		}
		for _, tier := range slices.Sorted(maps.Keys(j.durable)) {
			at := j.durable[tier]
			gauge(m.recoveryPointAge, age(now, at), j.id, tier)
			gauge(m.tierLag, max(0, j.latestAt.Sub(at).Seconds()), j.id, tier)
		}
		if b, ok := m.latestBytes(j.id, j.latest); ok {
			gauge(m.stepBytes, float64(b), j.id)
		}
		m.mu.Lock()
		lost, regangs := m.lostSec[j.id], [2]float64{}
		if r := m.regangs[j.id]; r != nil {
			regangs = *r
		}
		m.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(m.lost, prometheus.CounterValue, lost, j.id)
		ch <- prometheus.MustNewConstMetric(m.recoveries, prometheus.CounterValue, regangs[0], j.id, "ok")
		ch <- prometheus.MustNewConstMetric(m.recoveries, prometheus.CounterValue, regangs[1], j.id, "failed")
	}
}

// age is the seconds from t to now, never below 0.
func age(now, t time.Time) float64 { return max(0, now.Sub(t).Seconds()) }

// snapshot reads each job's steps of interest: tier copies under the
// tiering lock, then the index under c.mu (never both at once).
func (m *jobMetrics) snapshot() []jobSnap {
	c := m.c
	newest := map[string]map[string]int64{} // job -> tier -> newest durable step
	c.tiers.mu.Lock()
	for _, tc := range c.tiers.copies {
		if tc.State != tcDurable || tc.partial() {
			continue
		}
		if newest[tc.Job] == nil {
			newest[tc.Job] = map[string]int64{}
		}
		if s, ok := newest[tc.Job][tc.Tier]; !ok || tc.Step > s {
			newest[tc.Job][tc.Tier] = tc.Step
		}
	}
	c.tiers.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]jobSnap, 0, len(c.state.Jobs))
	for _, id := range slices.Sorted(maps.Keys(c.state.Jobs)) {
		j := c.state.Jobs[id]
		s := jobSnap{id: id, latest: j.Latest, protected: j.Protected, epoch: j.Epoch, worldSize: j.WorldSize, durable: map[string]time.Time{}}
		if st := j.Steps[j.Latest]; st != nil {
			s.latestAt = st.ConsistentAt
		} else {
			s.latest = -1
		}
		if st := j.Steps[j.Protected]; st != nil {
			s.protectedAt = st.ConsistentAt
		} else {
			s.protected = -1
		}
		for tier, step := range newest[id] {
			if st := j.Steps[step]; st != nil && !st.ConsistentAt.IsZero() {
				s.durable[tier] = st.ConsistentAt
			}
		}
		out = append(out, s)
	}
	return out
}

// latestBytes returns the bytes of job's step, read from the index once
// per step (a view, which holds c.mu a bounded time) and kept.
func (m *jobMetrics) latestBytes(job string, step int64) (uint64, bool) {
	m.mu.Lock()
	cached, ok := m.bytes[job]
	m.mu.Unlock()
	if ok && cached.step == step {
		return cached.bytes, true
	}
	v, err := m.c.view(context.Background(), job, step, -1, nil)
	if err != nil || v == nil {
		return 0, false
	}
	var total uint64
	seen := map[uint32]bool{}
	for _, cp := range v.copies {
		if !seen[cp.Rank] {
			seen[cp.Rank] = true
			total += cp.Size
		}
	}
	m.mu.Lock()
	m.bytes[job] = stepBytesCache{step: step, bytes: total}
	m.mu.Unlock()
	return total, true
}

// reganged records a re-gang that ended (ev.Ok or not): its count, its
// plan and restore phases, and, when it succeeded, a watch for the new
// gang's first consistent step, which ends its restart.
func (m *jobMetrics) reganged(ev *coordpb.JobEvent) {
	m.mu.Lock()
	if m.regangs[ev.Job] == nil {
		m.regangs[ev.Job] = &[2]float64{}
	}
	m.regangs[ev.Job][map[bool]int{true: 0, false: 1}[ev.Ok]]++
	m.mu.Unlock()
	if !ev.Ok {
		return
	}
	if ev.DetectedUnixNano > 0 && ev.PlannedUnixNano >= ev.DetectedUnixNano {
		m.phases.WithLabelValues(ev.Job, "plan").Observe(time.Duration(ev.PlannedUnixNano - ev.DetectedUnixNano).Seconds())
	}
	if ev.PlannedUnixNano > 0 && ev.RestoredUnixNano >= ev.PlannedUnixNano {
		m.phases.WithLabelValues(ev.Job, "restore").Observe(time.Duration(ev.RestoredUnixNano - ev.PlannedUnixNano).Seconds())
	}
	w := &restartWatch{step: ev.Step, epoch: ev.Epoch, restored: time.Unix(0, ev.RestoredUnixNano)}
	m.c.mu.Lock()
	if j := m.c.state.Jobs[ev.Job]; j != nil {
		w.from, w.perStep = stepPace(j, ev.Step)
	}
	m.c.mu.Unlock()
	m.mu.Lock()
	m.pending[ev.Job] = w
	m.mu.Unlock()
}

// stepPace returns when the job's step had become consistent, and the
// job's time per step up to it (from the consistent step before it; 0
// when there is none). The caller holds c.mu.
func stepPace(j *Job, step int64) (time.Time, time.Duration) {
	st := j.Steps[step]
	if st == nil {
		return time.Time{}, 0
	}
	var prev *Step
	for n, o := range j.Steps {
		if n < step && o.State == Consistent && !o.ConsistentAt.IsZero() && (prev == nil || n > prev.Step) {
			prev = o
		}
	}
	if prev == nil || !st.ConsistentAt.After(prev.ConsistentAt) {
		return st.ConsistentAt, 0
	}
	return st.ConsistentAt, st.ConsistentAt.Sub(prev.ConsistentAt) / time.Duration(step-prev.Step)
}

// consistent notes steps that became consistent: a re-ganged job's first
// one of its new gang ends its restart and settles the work it lost. The
// caller holds c.mu.
func (m *jobMetrics) consistent(keys []StepKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.pending) == 0 {
		return
	}
	for _, k := range keys {
		w := m.pending[k.Job]
		j := m.c.state.Jobs[k.Job]
		if w == nil || j == nil || k.Step <= w.step {
			continue
		}
		st := j.Steps[k.Step]
		if st == nil || st.Epoch != 0 && st.Epoch < w.epoch {
			continue
		}
		delete(m.pending, k.Job)
		m.phases.WithLabelValues(k.Job, "restart").Observe(max(0, st.ConsistentAt.Sub(w.restored).Seconds()))
		if !w.from.IsZero() {
			lost := st.ConsistentAt.Sub(w.from) - time.Duration(k.Step-w.step)*w.perStep
			m.lostSec[k.Job] += max(0, lost.Seconds())
		}
	}
}
