package agent

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	saves          *prometheus.CounterVec
	pinRefreshes   prometheus.Counter
	committedBytes prometheus.Counter
	corrupt        prometheus.Counter
	verifySeconds  prometheus.Histogram
	readBytes      prometheus.Counter
	transfers      *prometheus.CounterVec
	tierBytes      *prometheus.CounterVec
	// preparesExpired counts prepares never committed whose segments
	// were taken back (prepares.go).
	preparesExpired prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, a *Agent) *metrics {
	m := &metrics{
		saves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rewind_agent_saves_total",
			Help: "Saves by outcome: ok (committed), budget, no_space, fenced (a rank of an epoch its job has left).",
		}, []string{"result"}),
		preparesExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rewind_agent_prepares_expired_total",
			Help: "Prepares never committed within --prepare-ttl whose segments a save that needed the budget took back.",
		}),
		pinRefreshes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rewind_agent_pin_refreshes_total",
			Help: "Saves that asked the coordinator for a job's pins: every slot left held the consistent or protected step, or a step newer than the consistent one.",
		}),
		committedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rewind_agent_committed_bytes_total",
			Help: "Bytes of shards committed into shared memory.",
		}),
		corrupt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rewind_agent_corrupt_shards_total",
			Help: "Shards whose bytes did not match their checksums.",
		}),
		verifySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rewind_agent_verify_seconds",
			Help:    "Time to verify one shard's checksums.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}),
		readBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rewind_agent_read_bytes_total",
			Help: "Bytes of shards streamed to readers over gRPC.",
		}),
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rewind_agent_tier_transfers_total",
			Help: "Tier transfers (push, manifest, delete, fetch) by tier and outcome (ok, failed).",
		}, []string{"tier", "kind", "result"}),
		tierBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rewind_agent_tier_bytes_total",
			Help: "Bytes pushed to (or fetched from) durable tiers.",
		}, []string{"tier"}),
	}
	usedFn := func() float64 { u, _ := a.Used(); return float64(u) }
	budgetFn := func() float64 { _, b := a.Used(); return float64(b) }
	shards := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rewind_agent_committed_shards",
		Help: "Committed shards held in shared memory.",
	}, func() float64 {
		n := 0
		for _, s := range a.List("") {
			if s.State == stateCommitted {
				n++
			}
		}
		return float64(n)
	})
	reg.MustRegister(m.saves, m.preparesExpired, m.pinRefreshes, m.committedBytes, m.corrupt, m.verifySeconds, m.readBytes, shards, m.transfers, m.tierBytes,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rewind_agent_shm_bytes", Help: "Bytes of all segments in shared memory."}, usedFn),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rewind_agent_shm_budget_bytes", Help: "The node's shared-memory budget."}, budgetFn),
	)
	return m
}
