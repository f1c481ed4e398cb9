package agent

import (
	"context"
	"fmt"
	"time"

	"rewind.dev/rewind/membership"
)

// startMembership makes the agent a member of the cluster's failure
// detection and keeps trying to join GossipJoin until it has; it returns
// a function that leaves the cluster (a graceful stop: the coordinator
// waits for the agent to come back before recovering its jobs).
func (a *Agent) startMembership(ctx context.Context) (func(), error) {
	cfg := *a.cfg.Gossip
	cfg.Name = a.cfg.Node
	cfg.Meta = membership.Meta{Role: membership.RoleAgent, Domain: a.cfg.FailureDomain, GRPCAddr: a.advertise}
	if cfg.Logger == nil {
		cfg.Logger = a.log
	}
	m, err := membership.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("agent: membership: %w", err)
	}
	jctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for backoff := 200 * time.Millisecond; len(a.cfg.GossipJoin) > 0; backoff = min(2*backoff, 5*time.Second) {
			if _, err := m.Join(jctx, a.cfg.GossipJoin...); err == nil {
				a.log.Info("joined the cluster's failure detection", "seeds", a.cfg.GossipJoin, "members", len(m.Members()))
				return
			} else if jctx.Err() == nil {
				a.log.Warn("cannot join the cluster's failure detection yet", "seeds", a.cfg.GossipJoin, "err", err, "retry_in", backoff)
			}
			select {
			case <-jctx.Done():
				return
			case <-time.After(backoff):
			}
		}
	}()
	go func() {
		for ev := range m.Events() {
			switch ev.Kind {
			case membership.EventJoin, membership.EventAlive:
				a.peers.peerBack(ev.Member.Name)
			case membership.EventLost: // the verdicts in between are unknown: forget them
				a.peers.forgetDead()
			}
			if ev.Kind != membership.EventDead {
				continue
			}
			// A copy from a dead node would wait for bytes that never come
			// (a paused node's kernel keeps its connections open), holding
			// the rank's copy lock that a restore of the rank needs.
			if n := a.peers.cutCopies(ev.Member.Name); n > 0 {
				a.log.Warn("copies from a node declared dead cut off", "peer", ev.Member.Name, "copies", n)
			}
		}
	}()
	return func() {
		stop()
		<-done
		lctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = m.Leave(lctx)
	}, nil
}
