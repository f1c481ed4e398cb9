package coordinator

import (
	"maps"
	"slices"
	"sync"

	"rewind.dev/rewind/api/coordpb"
)

// orderStreams holds each agent's order stream (Transfers) and the orders
// for its node: queued until the node's stream takes them, then sent until
// the agent reports how they ended. It does not know what orders are for:
// tier copies (tiering), replicas (replication) and gang orders (gangs)
// keep their own state and claim the outcomes of the orders they sent. It
// also keeps what each connected agent last said of its tiers (TierReport),
// and which nodes' agents opened a stream since this coordinator began to
// lead (unfinished.go).
//
// Its lock is a leaf: it is taken under any other lock of the coordinator
// (a part's, then Coordinator.mu), and nothing is called while it is held.
type orderStreams struct {
	mu     sync.Mutex
	closed bool // the coordinator is closing: a stream ending changes nothing
	nextID uint64
	subs   map[string]*subscriber           // node -> its open order stream
	orders map[uint64]*order                // queued or sent, not yet reported
	health map[string][]*coordpb.TierHealth // node -> its tiers, as last reported
	seen   map[string]bool                  // nodes whose agent opened a stream since this coordinator began to lead
}

// order is a transfer order and the node it is for.
type order struct {
	node string
	o    *coordpb.TransferOrder
	sent bool
	by   *subscriber // the stream that took it, once sent
}

// subscriber is an agent's open Transfers stream.
type subscriber struct {
	tiers []string
	wake  chan struct{} // orders are waiting
	done  chan struct{} // closed when a newer stream replaces this one
}

func (s *subscriber) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func newOrderStreams() *orderStreams {
	return &orderStreams{subs: map[string]*subscriber{}, orders: map[uint64]*order{},
		health: map[string][]*coordpb.TierHealth{}, seen: map[string]bool{}}
}

// send queues an order for node, gives it its id and wakes the node's
// stream. It reports whether the node has a stream open.
func (q *orderStreams) send(node string, o *coordpb.TransferOrder) (connected bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.nextID++
	o.Id = q.nextID
	q.orders[o.Id] = &order{node: node, o: o}
	if s := q.subs[node]; s != nil {
		s.poke()
		return true
	}
	return false
}

// open opens node's order stream, and returns it and the stream it
// replaces (nil if none), which is told to end: the orders that one was
// sent are lost (the agent that had them is gone or restarted).
func (q *orderStreams) open(node string, tierNames []string) (s, old *subscriber) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if old = q.subs[node]; old != nil {
		close(old.done)
	}
	s = &subscriber{tiers: tierNames, wake: make(chan struct{}, 1), done: make(chan struct{})}
	q.subs[node] = s
	q.seen[node] = true
	return s, old
}

// close ends node's stream s, unless a newer one replaced it or the
// coordinator is closing; it reports whether s ended here (its sent
// orders are then lost).
func (q *orderStreams) close(node string, s *subscriber) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.subs[node] != s || q.closed {
		return false
	}
	delete(q.subs, node)
	delete(q.health, node)
	return true
}

// take returns node's orders not yet sent and marks them sent by sub, the
// node's open stream: a stream a newer one replaced takes nothing (it
// would send into a connection that is going away). Gang orders are
// forgotten once taken: no outcome is reported for them.
func (q *orderStreams) take(node string, sub *subscriber) []*coordpb.TransferOrder {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.subs[node] != sub {
		return nil
	}
	var out []*coordpb.TransferOrder
	for _, id := range slices.Sorted(maps.Keys(q.orders)) {
		if od := q.orders[id]; od.node == node && !od.sent {
			od.sent, od.by = true, sub
			out = append(out, od.o)
			if od.o.GetAbort() != nil || od.o.GetResume() != nil {
				delete(q.orders, id)
			}
		}
	}
	return out
}

// claim removes and returns the order an outcome reported by node is
// about; nil for an order of an earlier run, or a duplicate report.
func (q *orderStreams) claim(node string, ev *coordpb.TierEvent) *order {
	q.mu.Lock()
	defer q.mu.Unlock()
	od := q.orders[ev.Order]
	if od == nil || od.node != node || od.o.Kind() != ev.Kind {
		return nil
	}
	delete(q.orders, ev.Order)
	return od
}

// claimLost removes and returns, in order, the orders of the kinds given
// that are lost: those sub, a stream of node that ended, was sent and
// whose outcome never came, and, while node has no stream open, those
// queued for it and never sent (queued as its stream was ending, or for a
// node declared down: sub nil). Orders queued while a newer stream is
// open are that stream's to send.
func (q *orderStreams) claimLost(node string, sub *subscriber, kinds ...coordpb.OrderKind) []*order {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*order
	queuedLost := q.subs[node] == nil
	for _, id := range slices.Sorted(maps.Keys(q.orders)) {
		od := q.orders[id]
		lost := od.sent && sub != nil && od.by == sub || !od.sent && queuedLost && od.node == node
		if lost && slices.Contains(kinds, od.o.Kind()) {
			delete(q.orders, id)
			out = append(out, od)
		}
	}
	return out
}

// pending reports whether any of the orders ids is queued or sent still.
func (q *orderStreams) pending(ids []uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.ContainsFunc(ids, func(id uint64) bool { return q.orders[id] != nil })
}

// count returns how many orders queued or sent, and not reported, match.
func (q *orderStreams) count(match func(node string, o *coordpb.TransferOrder, sent bool) bool) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, od := range q.orders {
		if match(od.node, od.o, od.sent) {
			n++
		}
	}
	return n
}

// tiersOf returns the tiers node's agent can write, and whether its
// stream is open.
func (q *orderStreams) tiersOf(node string) ([]string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.subs[node]
	if s == nil {
		return nil, false
	}
	return s.tiers, true
}

// has reports whether node's stream is open and its agent can write tier.
func (q *orderStreams) has(node, tier string) bool {
	names, ok := q.tiersOf(node)
	return ok && slices.Contains(names, tier)
}

// withTier returns the first connected node, in name order, whose agent
// can write tier; "" if none.
func (q *orderStreams) withTier(tier string) string { return q.withTierBut(tier, nil) }

// withTierBut is withTier passing over the nodes skip names.
func (q *orderStreams) withTierBut(tier string, skip func(node string) bool) string {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, n := range slices.Sorted(maps.Keys(q.subs)) {
		if (skip == nil || !skip(n)) && slices.Contains(q.subs[n].tiers, tier) {
			return n
		}
	}
	return ""
}

// nodes returns the connected nodes in name order.
func (q *orderStreams) nodes() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Sorted(maps.Keys(q.subs))
}

// setHealth records how node's tiers are doing.
func (q *orderStreams) setHealth(node string, hs []*coordpb.TierHealth) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.health[node] = hs
	}
}

// status returns each connected node's tiers: as last reported, or by
// name alone before the agent reported them.
func (q *orderStreams) status() []*coordpb.NodeTiers {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*coordpb.NodeTiers
	for _, node := range slices.Sorted(maps.Keys(q.subs)) {
		nt := &coordpb.NodeTiers{Node: node}
		if hs := q.health[node]; len(hs) > 0 {
			nt.Tiers = hs
		} else {
			for _, name := range q.subs[node].tiers {
				nt.Tiers = append(nt.Tiers, &coordpb.TierHealth{Tier: name})
			}
		}
		out = append(out, nt)
	}
	return out
}

// eachHealth calls f with every tier health reported, under the lock.
func (q *orderStreams) eachHealth(f func(h *coordpb.TierHealth)) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, hs := range q.health {
		for _, h := range hs {
			f(h)
		}
	}
}

// eachNodeHealth calls f with every node's tier health, nodes in name
// order, under the lock.
func (q *orderStreams) eachNodeHealth(f func(node string, h *coordpb.TierHealth)) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, n := range slices.Sorted(maps.Keys(q.health)) {
		for _, h := range q.health[n] {
			f(n, h)
		}
	}
}

// resetSeen starts a lead: the nodes seen are those connected now (the
// streams of an earlier lead may have gone elsewhere since).
func (q *orderStreams) resetSeen() {
	q.mu.Lock()
	defer q.mu.Unlock()
	clear(q.seen)
	for n := range q.subs {
		q.seen[n] = true
	}
}

// unseen returns those of nodes whose agent has not opened a stream since
// this coordinator began to lead.
func (q *orderStreams) unseen(nodes []string) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.DeleteFunc(nodes, func(n string) bool { return q.seen[n] })
}

// shutdown stops every change: the coordinator is closing.
func (q *orderStreams) shutdown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
}
