package coordinator

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/tiers"
)

// tierMetrics are the metrics of transfers: tier copies (tiering) and
// replicas (replication) count their outcomes on the same counters.
type tierMetrics struct {
	transfers      *prometheus.CounterVec
	bytes          *prometheus.CounterVec
	skipped        *prometheus.CounterVec
	replicaSeconds prometheus.Histogram
	rediscovered   *prometheus.CounterVec
}

// registerTierMetrics registers the transfer metrics, and the gauges of
// tier copies and tier health computed from c's parts when scraped.
func (c *Coordinator) registerTierMetrics(reg prometheus.Registerer) *tierMetrics {
	m := &tierMetrics{
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rewind_coordinator_tier_transfers_total",
			Help: "Transfer outcomes reported by agents, by tier (shm for replicas), kind (push, manifest, delete, replicate) and result.",
		}, []string{"tier", "kind", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rewind_coordinator_tier_bytes_total",
			Help: "Bytes agents pushed to each tier.",
		}, []string{"tier"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rewind_coordinator_tier_skipped_total",
			Help: "Times a tier copy that came due waited because a node holding shards could not write the tier (not connected, or without the tier).",
		}, []string{"tier"}),
		rediscovered: newRediscoveredCounter(),
	}
	m.replicaSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "rewind_coordinator_replication_seconds",
		Help:    "Time from the orders to replicate a consistent step to its last replica reported.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	copies := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "rewind_coordinator_tier_copies",
		Help: "Steps' copies on durable tiers, by tier and state (copying, durable, failed, deleting).",
	}, []string{"tier", "state"})
	degraded := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "rewind_coordinator_tier_degraded_nodes",
		Help: "Nodes whose transfers to a tier are failing.",
	}, []string{"tier"})
	inflight := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "rewind_coordinator_tier_inflight_bytes",
		Help: "Bytes of running transfers not yet moved, over all nodes.",
	}, []string{"tier"})
	reg.MustRegister(m.transfers, m.bytes, m.skipped, m.replicaSeconds, m.rediscovered, &gaugeRefresher{c: c, copies: copies, degraded: degraded, inflight: inflight})
	return m
}

// gaugeRefresher computes the tier gauges when they are scraped; mu
// keeps two scrapes from mixing their counts.
type gaugeRefresher struct {
	c                          *Coordinator
	mu                         sync.Mutex
	copies, degraded, inflight *prometheus.GaugeVec
}

func (g *gaugeRefresher) Describe(ch chan<- *prometheus.Desc) {
	g.copies.Describe(ch)
	g.degraded.Describe(ch)
	g.inflight.Describe(ch)
}

func (g *gaugeRefresher) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.copies.Reset()
	g.degraded.Reset()
	g.inflight.Reset()
	t := g.c.tiers
	t.mu.Lock()
	for _, tc := range t.copies {
		g.copies.WithLabelValues(tc.Tier, string(tc.State)).Inc()
	}
	t.mu.Unlock()
	g.c.streams.eachHealth(func(h *coordpb.TierHealth) {
		if h.Degraded {
			g.degraded.WithLabelValues(h.Tier).Inc()
		}
		g.inflight.WithLabelValues(h.Tier).Add(float64(h.BytesTotal - min(h.BytesDone, h.BytesTotal)))
	})
	g.copies.Collect(ch)
	g.degraded.Collect(ch)
	g.inflight.Collect(ch)
}

// load restores tier copies and policies from the store. A copy that was
// in flight when the coordinator stopped cannot be finished (its orders
// are gone): it is failed and its partial shards removed once its nodes
// connect. Durable copies are put back in the index, in case the index
// writes that recorded them were grouped and lost.
func (t *tiering) load(copies []*tierCopy, policies map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for job, text := range policies {
		p, err := tiers.ParsePolicy(text)
		if err != nil {
			t.c.log.Error("stored policy no longer parses; the default applies", "job", job, "err", err)
			continue
		}
		t.policies[job] = p
	}
	for _, tc := range copies {
		t.copies[tc.key()] = tc
		k := tc.Job + "/" + tc.Tier
		if tc.Step >= t.lastStep[k] || t.last[k].IsZero() {
			t.last[k], t.lastStep[k] = tc.Started, tc.Step
		}
		switch tc.State {
		case tcCopying:
			t.fail(tc, "the coordinator restarted during the copy")
		case tcDurable:
			if err := t.index(tc, CopyCommitted); err != nil {
				t.c.log.Warn("re-indexing a durable tier copy", "copy", tc.String(), "err", err)
			}
		}
	}
}

// setPolicy sets a job's policy.
func (t *tiering) setPolicy(job string, p tiers.Policy) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.policies[job]; ok && old.String() == p.String() {
		return nil
	}
	if err := t.c.store.putPolicy(job, p.String()); err != nil {
		return err
	}
	t.policies[job] = p
	t.c.log.Info("job tier policy set", "job", job, "policy", p.String())
	return nil
}

// policyText returns a job's policy in its text form.
func (t *tiering) policyText(job string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.policy(job).String()
}

// poke makes the loop scan now: a step became consistent, and its copy
// should start before training reuses the step's slot.
func (t *tiering) poke() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// copiesOf returns a step's tier copies, by tier.
func (t *tiering) copiesOf(job string, step int64) []*coordpb.TierCopy {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*coordpb.TierCopy
	for _, name := range tiers.Names() {
		if tc := t.copies[tierKey{job, step, string(name)}]; tc != nil {
			out = append(out, tc.proto())
		}
	}
	return out
}

// Transfers streams node's orders to its agent.
func (s *server) Transfers(req *coordpb.TransfersRequest, stream coordpb.Coordinator_TransfersServer) error {
	if req.Node == "" {
		return toStatus(fmt.Errorf("%w: coordinator: transfers without a node name", ErrInvalid))
	}
	if n := len(req.BrokenGangs); n > s.c.cfg.MaxJobs {
		return toStatus(fmt.Errorf("%w: coordinator: node %s holds %d gangs broken, over the limit of %d jobs (--max-jobs)", ErrInvalid, req.Node, n, s.c.cfg.MaxJobs))
	}
	c := s.c
	sub := c.subscribe(req.Node, req.Tiers, req.BrokenGangs)
	defer c.unsubscribe(req.Node, sub)
	for {
		for _, o := range c.streams.take(req.Node, sub) {
			if o.GetResume() != nil { // the stream breaks after the order was taken
				if err := c.cfg.Faults.Check(stream.Context(), faultinject.CoordResumeSent); err != nil {
					return err
				}
			}
			if err := stream.Send(o); err != nil {
				return err
			}
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-sub.done:
			return nil
		case <-sub.wake:
		}
	}
}

// TierReport records how an agent's transfers ended and its tiers' health.
func (s *server) TierReport(ctx context.Context, req *coordpb.TierReportRequest) (*coordpb.TierReportResponse, error) {
	if req.Node == "" {
		return nil, toStatus(fmt.Errorf("%w: coordinator: tier report without a node name", ErrInvalid))
	}
	s.c.tierReport(req)
	return &coordpb.TierReportResponse{}, nil
}

// TierStatus returns the tier health each connected agent last reported.
func (s *server) TierStatus(ctx context.Context, req *coordpb.TierStatusRequest) (*coordpb.TierStatusResponse, error) {
	return &coordpb.TierStatusResponse{Nodes: s.c.streams.status()}, nil
}
