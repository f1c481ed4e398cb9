package membership

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	events *prometheus.CounterVec
	lost   prometheus.Counter
	// keyReloads counts changes of the gossip keyring (keys.go).
	keyReloads prometheus.Counter
	members    []prometheus.Collector
}

func newMetrics(m *Members) *metrics {
	met := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rewind_membership_events_total",
			Help: "Membership changes this member saw, by kind (join, suspect, alive, update, dead, leave).",
		}, []string{"kind"}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rewind_membership_events_lost_total",
			Help: "Membership events dropped because the reader of Events fell too far behind.",
		}),
		keyReloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rewind_membership_key_reloads_total",
			Help: "Changes of the gossip keyring read from its key file (a key added, made primary or removed).",
		}),
	}
	for _, st := range []State{StateAlive, StateSuspect, StateDead, StateLeft} {
		met.members = append(met.members, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "rewind_membership_members",
			Help:        "Members in this member's view, by state.",
			ConstLabels: prometheus.Labels{"state": st.String()},
		}, func() float64 {
			m.mu.Lock()
			defer m.mu.Unlock()
			n := 0
			for _, e := range m.members {
				if e.State == st {
					n++
				}
			}
			return float64(n)
		}))
	}
	return met
}

func (met *metrics) register(reg prometheus.Registerer) error {
	for _, c := range append([]prometheus.Collector{met.events, met.lost, met.keyReloads}, met.members...) {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
