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
	saveSeconds    *prometheus.HistogramVec
	jobRefused     *prometheus.CounterVec
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
		saveSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rewind_agent_save_seconds",
			Help: "Time a rank's save blocks its training step, as the agent sees it: from Prepare to Commit (the copy into shared memory and its checksums), by job (job_id).",
			// 1 ms to about 65 s: a small model's save to a large one's.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 17),
		}, []string{"job_id"}),
		jobRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rewind_agent_job_refused_total",
			Help: "Calls on the SDK's sockets refused for want of the job's token (no token, another job's, a call no rank may make), by socket (grpc, segment).",
		}, []string{"socket"}),
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
	isolation := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rewind_agent_job_isolation",
		Help: "1 when the agent serves a job's checkpoints on its socket only to holders of the job's token, 0 when any local process that opens the socket reaches every job's."},
		func() float64 { return b2f(a.cfg.JobKeys.Enabled()) })
	reg.MustRegister(m.jobRefused, isolation, m.saves, m.saveSeconds, m.preparesExpired, newNodeMetrics(a), m.pinRefreshes, m.committedBytes, m.corrupt, m.verifySeconds, m.readBytes, shards, m.transfers, m.tierBytes,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rewind_agent_shm_bytes", Help: "Bytes of all segments in shared memory."}, usedFn),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rewind_agent_shm_budget_bytes", Help: "The node's shared-memory budget."}, budgetFn),
	)
	return m
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
