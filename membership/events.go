package membership

import (
	"sync"
	"time"
)

// State is a member's state as this member sees it.
type State int

// States.
const (
	// StateAlive: answering probes.
	StateAlive State = iota
	// StateSuspect: a probe failed; it has until the suspicion timeout to
	// refute. Still a member, but not counted for quorum.
	StateSuspect
	// StateDead: declared failed. Its shards must come from elsewhere.
	StateDead
	// StateLeft: left gracefully (Leave). No longer counted as known.
	StateLeft
)

func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateSuspect:
		return "suspect"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	}
	return "unknown"
}

// EventKind says what changed.
type EventKind int

// Event kinds.
const (
	// EventJoin: a member is alive for the first time, or again after
	// being dead or having left.
	EventJoin EventKind = iota
	// EventSuspect: an alive member is suspected.
	EventSuspect
	// EventAlive: a suspected member refuted the suspicion.
	EventAlive
	// EventUpdate: a member's metadata changed.
	EventUpdate
	// EventDead: a member was declared dead.
	EventDead
	// EventLeave: a member left gracefully.
	EventLeave
	// EventLost: the reader fell more than Config.EventQueueLimit events
	// behind and Lost events were dropped; Members has the current view.
	EventLost
)

func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventSuspect:
		return "suspect"
	case EventAlive:
		return "alive"
	case EventUpdate:
		return "update"
	case EventDead:
		return "dead"
	case EventLeave:
		return "leave"
	case EventLost:
		return "lost"
	}
	return "unknown"
}

// Event is one change of one member, as this member saw it.
type Event struct {
	Kind EventKind
	// Member is the member after the change (zero for EventLost).
	Member Member
	// At is when this member saw the change.
	At time.Time
	// Lost counts the events dropped before this one (EventLost only).
	Lost int
}

// queue holds events between memberlist's goroutines, which must never
// block on a slow reader, and the reader of Events: push never blocks, and
// one goroutine (run) delivers in order. Beyond limit the oldest events
// are dropped and replaced by an EventLost.
type queue struct {
	mu      sync.Mutex
	pending []Event
	dropped int
	limit   int
	wake    chan struct{} // one token: pending may be non-empty
	out     chan Event
}

func newQueue(limit int) *queue {
	return &queue{limit: limit, wake: make(chan struct{}, 1), out: make(chan Event)}
}

// push appends ev; it never blocks. It reports how many events it dropped.
func (q *queue) push(ev Event) (dropped int) {
	q.mu.Lock()
	q.pending = append(q.pending, ev)
	if over := len(q.pending) - q.limit; over > 0 {
		q.pending = append(q.pending[:0], q.pending[over:]...)
		q.dropped += over
		dropped = over
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return dropped
}

func (q *queue) next(now func() time.Time) (Event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dropped > 0 {
		ev := Event{Kind: EventLost, At: now(), Lost: q.dropped}
		q.dropped = 0
		return ev, true
	}
	if len(q.pending) == 0 {
		return Event{}, false
	}
	ev := q.pending[0]
	q.pending[0] = Event{}
	q.pending = q.pending[1:]
	return ev, true
}

// run delivers events until done is closed, then closes out.
func (q *queue) run(done <-chan struct{}, now func() time.Time) {
	defer close(q.out)
	for {
		ev, ok := q.next(now)
		if !ok {
			select {
			case <-q.wake:
				continue
			case <-done:
				return
			}
		}
		select {
		case q.out <- ev:
		case <-done:
			return
		}
	}
}
