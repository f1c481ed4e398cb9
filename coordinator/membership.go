package coordinator

import (
	"context"
	"fmt"
	"slices"
	"time"

	"rewind.dev/rewind/membership"
)

// Failure detection: the coordinator is a member of the cluster's
// memberlist (Config.Gossip). An agent declared dead, or gone, has its
// jobs recovered (NodeDown), but only while the coordinator sees a strict
// majority of the cluster's members alive: on the minority side of a
// partition it sees the others "die" and must not act on it, and on the
// majority side without a coordinator nothing acts at all, so one
// partition never produces two recoveries.

// startMembership joins the cluster's failure detection; it returns a
// function that leaves it.
func (c *Coordinator) startMembership(ctx context.Context, grpcAddr string) (func(), error) {
	cfg := *c.cfg.Gossip
	if cfg.Name == "" {
		cfg.Name = "coordinator"
	}
	cfg.Meta = membership.Meta{Role: membership.RoleCoordinator, GRPCAddr: grpcAddr}
	if cfg.Logger == nil {
		cfg.Logger = c.cfg.Logger
	}
	m, err := membership.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("coordinator: membership: %w", err)
	}
	c.members.Store(m)
	if len(cfg.Seeds) > 0 {
		if _, err := m.Join(ctx); err != nil {
			c.log.Warn("joining the cluster's seeds failed; agents will join this coordinator", "err", err)
		}
	}
	done := make(chan struct{})
	go func() { defer close(done); c.watchMembers(m) }()
	return func() {
		_ = m.Shutdown()
		<-done
	}, nil
}

// watchMembers acts on the deaths failure detection reports. An agent
// that left gracefully (a restart, an upgrade) has LeaveGrace to come
// back before its jobs are recovered; a dead one has none.
func (c *Coordinator) watchMembers(m *membership.Members) {
	leaving := map[string]*time.Timer{}
	defer func() {
		for _, t := range leaving {
			t.Stop()
		}
	}()
	for ev := range m.Events() {
		name := ev.Member.Name
		if ev.Member.Meta.Role != membership.RoleAgent {
			continue
		}
		switch ev.Kind {
		case membership.EventSuspect:
			c.log.Info("agent suspected", "node", name)
		case membership.EventJoin, membership.EventAlive:
			if t := leaving[name]; t != nil {
				t.Stop()
				delete(leaving, name)
				c.log.Info("agent back within its leave grace", "node", name)
			}
			go c.memberBack(m, name)
		case membership.EventDead:
			c.memberDown(name, "declared dead by failure detection", ev.At)
		case membership.EventLeave:
			at := ev.At
			c.log.Info("agent left the cluster; recovering its jobs unless it comes back", "node", name, "grace", c.cfg.LeaveGrace)
			leaving[name] = time.AfterFunc(c.cfg.LeaveGrace, func() { c.memberDown(name, "left the cluster and did not come back", at) })
		}
	}
}

func (c *Coordinator) memberDown(node, how string, at time.Time) {
	c.log.Warn("agent down", "node", node, "how", how)
	if _, err := c.nodeDown(node, fmt.Sprintf("%s at %s", how, at.Format(time.StampMilli)), true); err != nil {
		c.log.Warn("not recovering", "node", node, "err", err)
		return
	}
	// Its work moves elsewhere: it no longer counts towards quorum (a
	// cluster that loses nodes one by one keeps its majority), and it
	// joins again as new if it comes back.
	if m, _ := c.members.Load().(*membership.Members); m != nil {
		if err := m.Forget(node); err != nil {
			c.log.Debug("forgetting a dead member", "node", node, "err", err)
		}
	}
}

// memberBack brings back a node failure detection declared dead that is
// alive again in gossip, once it answers a direct ping (gossip alone may
// be stale). Its agent may have kept its connection, and so never
// registers again: without this the node stayed down, and the jobs whose
// recovery stalled for want of live nodes with it (retry.go).
func (c *Coordinator) memberBack(m *membership.Members, node string) {
	c.mu.Lock()
	detected := c.detectedDown[node]
	c.mu.Unlock()
	if !detected {
		return // up, or declared down by an operator: theirs to undo
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	q, err := m.CheckQuorum(ctx, []string{node})
	if err != nil || !slices.Contains(q.Reached, node) {
		c.log.Info("agent alive in gossip but not answering a direct ping: still down", "node", node, "err", err)
		return
	}
	c.log.Info("agent declared dead answers again: back", "node", node)
	c.nodeUp(node)
}

// GossipAddr returns the coordinator's memberlist address, for agents to
// join; empty without failure detection.
func (c *Coordinator) GossipAddr() string {
	m, _ := c.members.Load().(*membership.Members)
	if m == nil {
		return ""
	}
	return m.Local().Addr
}

// quorum reports whether this coordinator reaches a strict majority of
// the cluster's last known members now: it pings them directly rather
// than trust its view, in which, as a partition begins, the members on
// the other side die one at a time and the first death is seen while the
// others still look alive. Always true without failure detection. It
// returns the members that answered.
func (c *Coordinator) quorum() (reached []string, ok bool) {
	if c.cfg.Quorum != nil {
		return nil, c.cfg.Quorum()
	}
	m, _ := c.members.Load().(*membership.Members)
	if m == nil {
		return nil, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	q, err := m.CheckQuorum(ctx, nil)
	if err != nil || !q.OK {
		c.log.Warn("no quorum", "reached", q.Reached, "unreached", q.Unreached, "err", err)
		return q.Reached, false
	}
	return q.Reached, true
}
