package coordinator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/tiers"
)

type tierMetrics struct {
	transfers      *prometheus.CounterVec
	bytes          *prometheus.CounterVec
	skipped        *prometheus.CounterVec
	replicaSeconds prometheus.Histogram
	rediscovered   *prometheus.CounterVec
}

func (t *tierer) registerMetrics(reg prometheus.Registerer) {
	t.m = tierMetrics{
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
	t.m.replicaSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
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
	reg.MustRegister(t.m.transfers, t.m.bytes, t.m.skipped, t.m.replicaSeconds, t.m.rediscovered, &gaugeRefresher{t: t, copies: copies, degraded: degraded, inflight: inflight})
}

// gaugeRefresher computes the tier gauges when they are scraped.
type gaugeRefresher struct {
	t                          *tierer
	copies, degraded, inflight *prometheus.GaugeVec
}

func (g *gaugeRefresher) Describe(ch chan<- *prometheus.Desc) {
	g.copies.Describe(ch)
	g.degraded.Describe(ch)
	g.inflight.Describe(ch)
}

func (g *gaugeRefresher) Collect(ch chan<- prometheus.Metric) {
	g.t.mu.Lock()
	g.copies.Reset()
	g.degraded.Reset()
	g.inflight.Reset()
	for _, tc := range g.t.copies {
		g.copies.WithLabelValues(tc.Tier, tc.State).Inc()
	}
	for _, hs := range g.t.health {
		for _, h := range hs {
			if h.Degraded {
				g.degraded.WithLabelValues(h.Tier).Inc()
			}
			g.inflight.WithLabelValues(h.Tier).Add(float64(h.BytesTotal - min(h.BytesDone, h.BytesTotal)))
		}
	}
	g.t.mu.Unlock()
	g.copies.Collect(ch)
	g.degraded.Collect(ch)
	g.inflight.Collect(ch)
}

// load restores tier copies and policies from the store. A copy that was
// in flight when the coordinator stopped cannot be finished (its orders
// are gone): it is failed and its partial shards removed once its nodes
// connect. Durable copies are put back in the index, in case the index
// writes that recorded them were grouped and lost.
func (t *tierer) load() error {
	copies, policies, replicas, err := t.c.store.loadTiering()
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	maps.Copy(t.jobReplicas, replicas)
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
			if err := t.index(tc, "committed"); err != nil {
				t.c.log.Warn("re-indexing a durable tier copy", "copy", tc.String(), "err", err)
			}
		}
	}
	return nil
}

// setPolicy sets a job's policy.
func (t *tierer) setPolicy(job string, p tiers.Policy) error {
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

// setReplicas sets how many peers keep a copy of each of job's shards.
func (t *tierer) setReplicas(job string, n int) error {
	if n < 0 || n > 8 {
		return fmt.Errorf("%w: coordinator: job %s: replicas %d out of range [0, 8]", ErrInvalid, job, n)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.jobReplicas[job]; ok && old == n {
		return nil
	}
	if err := t.c.store.putReplicas(job, n); err != nil {
		return err
	}
	t.jobReplicas[job] = n
	t.c.log.Info("job replicas set", "job", job, "replicas", n)
	return nil
}

// policyText returns a job's policy in its text form.
func (t *tierer) policyText(job string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.policy(job).String()
}

// run scans for due steps until ctx ends.
func (t *tierer) run(ctx context.Context) {
	go t.rediscover(ctx)
	tick := time.NewTicker(scanEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			t.scan()
		case <-t.wake:
			t.scan()
		}
	}
}

// poke makes the loop scan now: a step became consistent, and its copy
// should start before training reuses the step's slot.
func (t *tierer) poke() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// scanEvery is how often the coordinator also looks for steps due on a
// tier by time (every=30m) when no step becomes consistent.
const scanEvery = 100 * time.Millisecond

// subscribe opens node's order stream; a newer stream replaces an older
// one, whose unreported orders are failed (the agent that had them is
// gone or restarted).
func (t *tierer) subscribe(node string, tierNames []string, broken map[string]int64) *subscriber {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.subs[node]; old != nil {
		close(old.done)
		t.lost(node)
	}
	s := &subscriber{tiers: tierNames, wake: make(chan struct{}, 1), done: make(chan struct{})}
	t.subs[node] = s
	t.seen[node] = true
	t.c.log.Info("agent subscribed to tier transfers", "node", node, "tiers", tierNames)
	t.replayGangs(node, broken)
	t.noteBroken(node, broken)
	s.poke()
	t.rd.poke() // its tiers may hold copies this index does not know
	return s
}

func (t *tierer) unsubscribe(node string, s *subscriber) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.subs[node] != s || t.closed {
		return
	}
	delete(t.subs, node)
	delete(t.health, node)
	t.lost(node)
}

// lost fails the orders a node received and never reported.
func (t *tierer) lost(node string) {
	for _, id := range slices.Sorted(maps.Keys(t.orders)) {
		od := t.orders[id]
		if od.node == node && od.sent {
			t.handle(node, &coordpb.TierEvent{Order: id, Kind: od.o.Kind, Job: od.o.Job, Step: od.o.Step, Tier: od.o.Tier,
				Rank: od.o.Rank, Error: "the agent of node " + node + " disconnected during the transfer"})
		}
	}
}

// take returns node's orders not yet sent and marks them sent, for sub,
// the node's open stream: a stream a newer one replaced takes nothing (it
// would send into a connection that is going away).
func (t *tierer) take(node string, sub *subscriber) []*coordpb.TransferOrder {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.subs[node] != sub {
		return nil
	}
	var out []*coordpb.TransferOrder
	for _, id := range slices.Sorted(maps.Keys(t.orders)) {
		if od := t.orders[id]; od.node == node && !od.sent {
			od.sent = true
			out = append(out, od.o)
			if od.o.Kind == "abort" || od.o.Kind == "resume" { // no outcome is reported
				delete(t.orders, id)
			}
		}
	}
	return out
}

// report applies an agent's tier report.
func (t *tierer) report(req *coordpb.TierReportRequest) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	for _, ev := range req.Events {
		t.handle(req.Node, ev)
	}
	if len(req.Health) > 0 {
		t.health[req.Node] = req.Health
	}
}

// copiesOf returns a step's tier copies, by tier.
func (t *tierer) copiesOf(job string, step int64) []*coordpb.TierCopy {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*coordpb.TierCopy
	for _, name := range []string{"nvme", "pfs", "s3"} {
		if tc := t.copies[tierKey{job, step, name}]; tc != nil {
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
	t := s.c.tiers
	sub := t.subscribe(req.Node, req.Tiers, req.BrokenGangs)
	defer t.unsubscribe(req.Node, sub)
	for {
		for _, o := range t.take(req.Node, sub) {
			if o.Kind == "resume" { // the stream breaks after the order was taken
				if err := s.c.cfg.Faults.Check(stream.Context(), faultinject.CoordResumeSent); err != nil {
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
	s.c.tiers.report(req)
	return &coordpb.TierReportResponse{}, nil
}

// TierStatus returns the tier health each connected agent last reported.
func (s *server) TierStatus(ctx context.Context, req *coordpb.TierStatusRequest) (*coordpb.TierStatusResponse, error) {
	t := s.c.tiers
	t.mu.Lock()
	defer t.mu.Unlock()
	resp := &coordpb.TierStatusResponse{}
	for _, node := range slices.Sorted(maps.Keys(t.subs)) {
		nt := &coordpb.NodeTiers{Node: node}
		if hs := t.health[node]; len(hs) > 0 {
			nt.Tiers = hs
		} else {
			for _, name := range t.subs[node].tiers {
				nt.Tiers = append(nt.Tiers, &coordpb.TierHealth{Tier: name})
			}
		}
		resp.Nodes = append(resp.Nodes, nt)
	}
	return resp, nil
}
