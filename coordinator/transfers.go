package coordinator

import (
	"context"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// Transfers: every agent keeps one order stream open (Transfers) and
// reports how its orders ended (TierReport). Three parts of the
// coordinator send orders on the streams (orders.go), each owning its
// state under its own lock: tier copies and retention (tiering.go),
// replicas in peers' memory (replicate.go), and gang orders (gang.go).
// Here the streams meet the parts: an outcome goes to the part whose
// order it was, and when a stream ends each part fails its own orders
// that the stream was sent and never reported. No two parts' locks are
// held together: each is taken before Coordinator.mu, and the order
// streams' lock last.

// subscribe opens node's order stream; a newer stream replaces an older
// one, whose unreported orders are failed (the agent that had them is
// gone or restarted). The gang orders the agent missed are sent again.
func (c *Coordinator) subscribe(node string, tierNames []string, broken map[string]int64) *subscriber {
	s, old := c.streams.open(node, tierNames)
	if old != nil {
		c.lost(node, old)
	}
	c.log.Info("agent subscribed to tier transfers", "node", node, "tiers", tierNames)
	c.gangs.reconnected(node, broken)
	s.poke()
	c.tiers.rd.poke() // its tiers may hold copies this index does not know
	return s
}

// unsubscribe ends node's stream s, failing the orders it was sent.
func (c *Coordinator) unsubscribe(node string, s *subscriber) {
	if c.streams.close(node, s) {
		c.lost(node, s)
	}
}

// lost fails the orders node's stream s was sent and never reported, and
// those queued for node while it has no stream open (claimLost).
func (c *Coordinator) lost(node string, s *subscriber) {
	why := "the agent of node " + node + " disconnected during the transfer"
	c.tiers.lost(node, s, why)
	c.replication.lost(node, s, why)
}

// dropQueued fails the orders queued for node, declared down, that no
// stream of it took: no agent of it is left to take them, and the copies
// and replicas waiting on them would wait for good.
func (c *Coordinator) dropQueued(node string) {
	why := "node " + node + " was declared down before its agent took the order"
	c.tiers.lost(node, nil, why)
	c.replication.lost(node, nil, why)
}

// tierReport applies an agent's tier report: each outcome by the part
// whose order it is.
func (c *Coordinator) tierReport(req *coordpb.TierReportRequest) {
	for _, ev := range req.Events {
		if ev.Kind == coordpb.OrderKind_ORDER_KIND_REPLICATE {
			c.replication.outcome(req.Node, ev)
		} else {
			c.tiers.outcome(req.Node, ev)
		}
	}
	if len(req.Health) > 0 {
		c.streams.setHealth(req.Node, req.Health)
	}
}

// lostEvent is the outcome of an order whose stream ended before the
// agent reported it.
func lostEvent(od *order, why string) *coordpb.TierEvent {
	o := od.o
	return &coordpb.TierEvent{Order: o.Id, Kind: o.Kind(), Job: o.Job, Step: o.Step, Tier: o.TierName(), Rank: o.RankOf(), Error: why}
}

// runTransfers makes replicas and tier copies of the steps that become
// consistent, and lists the tiers' copies (rediscover.go), until ctx ends.
func (c *Coordinator) runTransfers(ctx context.Context) {
	go c.tiers.rediscover(ctx)
	go c.replication.replicateCommits(ctx)
	tick := time.NewTicker(scanEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-c.tiers.wake:
		}
		c.replication.scan()
		c.tiers.scan()
	}
}

// scanEvery is how often the coordinator also looks for steps due on a
// tier by time (every=30m) when no step becomes consistent.
const scanEvery = 100 * time.Millisecond
