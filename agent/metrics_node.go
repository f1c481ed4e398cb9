package agent

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// nodeMetrics are the node's gauges computed when scraped: its identity
// (rewind_agent_info, which dashboards join on the scrape's instance to
// name the node), its segments by state, its tiers' health, and each
// job's bytes against its share of the budget.
type nodeMetrics struct {
	a                                             *Agent
	info, segments, degraded, jobBytes, jobBudget *prometheus.Desc
}

func newNodeMetrics(a *Agent) *nodeMetrics {
	return &nodeMetrics{
		a: a,
		info: prometheus.NewDesc("rewind_agent_info", "The agent's node and failure domain; always 1.",
			[]string{"node", "failure_domain"}, nil),
		segments: prometheus.NewDesc("rewind_agent_segments", "Segments in shared memory, by state (writing, committed, corrupt, staged).",
			[]string{"state"}, nil),
		degraded: prometheus.NewDesc("rewind_agent_tier_degraded", "1 while transfers to a tier fail and are retried, else 0.",
			[]string{"tier"}, nil),
		jobBytes: prometheus.NewDesc("rewind_agent_shm_job_bytes", "Bytes of a job's segments in shared memory, its ranks' and its replicas, by job (job_id); what --job-budget caps.",
			[]string{"job_id"}, nil),
		jobBudget: prometheus.NewDesc("rewind_agent_shm_job_budget_bytes", "The most of the budget one job's segments may take (--job-budget; 0: no cap).", nil, nil),
	}
}

func (m *nodeMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.info
	ch <- m.segments
	ch <- m.degraded
	ch <- m.jobBytes
	ch <- m.jobBudget
}

func (m *nodeMetrics) Collect(ch chan<- prometheus.Metric) {
	a := m.a
	ch <- prometheus.MustNewConstMetric(m.info, prometheus.GaugeValue, 1, a.cfg.Node, a.cfg.FailureDomain)
	ch <- prometheus.MustNewConstMetric(m.jobBudget, prometheus.GaugeValue, float64(a.cfg.JobBudgetBytes))
	for job, n := range a.jobBytes() {
		ch <- prometheus.MustNewConstMetric(m.jobBytes, prometheus.GaugeValue, float64(n), job)
	}
	counts := map[slotState]int{stateWriting: 0, stateCommitted: 0, stateCorrupt: 0, stateStaged: 0}
	for _, s := range a.List("") {
		counts[s.State]++
	}
	for _, st := range slices.Sorted(maps.Keys(counts)) {
		ch <- prometheus.MustNewConstMetric(m.segments, prometheus.GaugeValue, float64(counts[st]), string(st))
	}
	if t := a.tr; t != nil {
		t.mu.Lock()
		for _, n := range t.names {
			if h := t.health[n]; h != nil {
				ch <- prometheus.MustNewConstMetric(m.degraded, prometheus.GaugeValue, map[bool]float64{true: 1}[h.degraded], n)
			}
		}
		t.mu.Unlock()
	}
}
