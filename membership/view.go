package membership

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// delegate gives memberlist this member's metadata; rewind sends no user
// messages or state through memberlist.
type delegate struct{ meta atomic.Pointer[[]byte] }

var _ memberlist.Delegate = (*delegate)(nil)

func (d *delegate) NodeMeta(limit int) []byte {
	meta := *d.meta.Load()
	if len(meta) > limit { // cannot happen: Config.Validate checked MetaMaxSize
		return nil
	}
	return meta
}
func (*delegate) NotifyMsg([]byte)                           {}
func (*delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (*delegate) LocalState(join bool) []byte                { return nil }
func (*delegate) MergeRemoteState(buf []byte, join bool)     {}

// events receives memberlist's notifications. memberlist calls them with
// its node table locked, so they only update the view and queue events:
// they never block and never call back into memberlist.
type events struct{ m *Members }

var _ memberlist.EventDelegate = events{}

func (e events) NotifyJoin(n *memberlist.Node) { e.m.observe(n, StateAlive, EventJoin) }

// NotifyLeave cannot tell a death from a graceful leave by n.State, which
// memberlist never sets (its table keeps the state in a field of its own):
// a member that leaves first spreads metadata marked leaving (Leave), and
// the node table corrects the rare case where the mark arrived late
// (applySnapshot).
func (e events) NotifyLeave(n *memberlist.Node) { e.m.observe(n, StateDead, EventDead) }

func (e events) NotifyUpdate(n *memberlist.Node) { e.m.observe(n, keepState, EventUpdate) }

// keepState tells observe that a notification does not change the state.
const keepState State = -1

// observe applies one memberlist notification.
func (m *Members) observe(n *memberlist.Node, state State, kind EventKind) {
	meta, leaving, metaErr := decodeMeta(n.Meta)
	now := m.cfg.Clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.seq++
	e := m.members[n.Name]
	isNew := e == nil
	if isNew {
		e = &entry{Member: Member{Name: n.Name, State: StateAlive, Since: now}}
		m.members[n.Name] = e
	}
	e.seq = m.seq
	e.Addr = nodeAddr(n)
	if !bytes.Equal(e.meta, n.Meta) || e.meta == nil {
		e.meta = bytes.Clone(n.Meta)
		e.Meta, e.MetaErr, e.leaving = meta, metaErr, leaving
		if metaErr != nil {
			m.log.Warn("member metadata unreadable", "peer", n.Name, "err", metaErr)
		}
	}
	if state == StateDead && e.leaving {
		state, kind = StateLeft, EventLeave
	}
	if state != keepState {
		if state == e.State && !isNew {
			return // nothing new to tell
		}
		e.State, e.Since = state, now
	}
	m.emitLocked(kind, e, now)
}

// emitLocked logs a change, counts it and queues its event.
func (m *Members) emitLocked(kind EventKind, e *entry, now time.Time) {
	args := []any{"peer", e.Name, "addr", e.Addr, "role", e.Meta.Role, "domain", e.Meta.Domain}
	switch kind {
	case EventDead, EventSuspect:
		m.log.Warn("member "+kind.String(), args...)
	case EventUpdate:
		m.log.Debug("member updated", args...)
	default:
		m.log.Info("member "+kind.String(), args...)
	}
	m.met.events.WithLabelValues(kind.String()).Inc()
	if lost := m.queue.push(Event{Kind: kind, Member: e.Member, At: now}); lost > 0 {
		m.met.lost.Add(float64(lost))
	}
}

// pollStates reads memberlist's node table every StatePollInterval and
// turns alive↔suspect changes into events.
func (m *Members) pollStates() {
	ticker := time.NewTicker(m.cfg.StatePollInterval)
	defer ticker.Stop()
	failing := false
	for {
		select {
		case <-m.done:
			return
		case <-ticker.C:
		}
		m.mu.Lock()
		seq := m.seq
		m.mu.Unlock()
		nodes, err := readNodeTable(m.tr, m.cfg.TCPTimeout, m.cfg.Label, m.keyring)
		if errors.Is(err, errTransportClosed) {
			return
		}
		if err != nil {
			if !failing {
				m.log.Warn("reading memberlist's node table failed; suspicions go unreported", "err", err)
			}
			failing = true
			continue
		}
		failing = false
		m.applySnapshot(seq, nodes)
	}
}

// applySnapshot applies what memberlist does not notify, from a table read
// after notification seq: suspicions, refutations, and leaves seen as
// deaths. A member notified since then is skipped: the table may predate
// what the notification told.
func (m *Members) applySnapshot(seq uint64, nodes []nodeState) {
	now := m.cfg.Clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	for _, n := range nodes {
		e := m.members[n.Name]
		if e == nil || e.seq > seq {
			continue
		}
		var state State
		var kind EventKind
		switch {
		case n.State == memberlist.StateAlive && e.State == StateSuspect:
			state, kind = StateAlive, EventAlive
		case n.State == memberlist.StateSuspect && e.State == StateAlive:
			state, kind = StateSuspect, EventSuspect
		case n.State == memberlist.StateLeft && e.State == StateDead:
			state, kind = StateLeft, EventLeave // its leaving mark came after its leave
		default:
			continue // joins and deaths come from notifications
		}
		e.State, e.Since = state, now
		m.emitLocked(kind, e, now)
	}
}

// maxReconnects bounds the dead members one reconnect round tries, each
// costing up to TCPTimeout when the member is really gone.
const maxReconnects = 3

// reconnect joins dead members again every ReconnectInterval, and the
// seeds while this member sees no one else: after a partition heals, each
// side has declared the other dead and memberlist alone stops probing it.
func (m *Members) reconnect() {
	ticker := time.NewTicker(m.cfg.ReconnectInterval)
	defer ticker.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-ticker.C:
		}
		addrs := m.reconnectTargets()
		if len(addrs) == 0 {
			continue
		}
		n, err := m.ml.Join(addrs)
		m.log.Debug("reconnect", "tried", addrs, "answered", n, "err", err)
	}
}

func (m *Members) reconnectTargets() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var dead []string
	others := 0
	for _, e := range m.members {
		if e.Name == m.cfg.Name {
			continue
		}
		switch e.State {
		case StateDead:
			dead = append(dead, e.Addr)
		case StateAlive, StateSuspect:
			others++
		}
	}
	rand.Shuffle(len(dead), func(i, j int) { dead[i], dead[j] = dead[j], dead[i] })
	if len(dead) > maxReconnects {
		dead = dead[:maxReconnects]
	}
	if others == 0 {
		dead = append(dead, m.cfg.Seeds...)
	}
	return dead
}
