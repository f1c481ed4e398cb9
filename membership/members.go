package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
)

// Member is one member of the cluster as this member sees it.
type Member struct {
	Name string
	// Addr is its memberlist address, host:port.
	Addr string
	Meta Meta
	// MetaErr is set when its metadata could not be decoded (Meta is then
	// zero): a member running a newer or foreign build.
	MetaErr error
	State   State
	// Since is when this member saw it enter State.
	Since time.Time
}

// Members is this process's membership in the cluster: it runs memberlist's
// failure detection, keeps the view of every member ever seen (until
// Forget or Leave), and delivers changes on Events.
//
// All methods are safe for concurrent use.
type Members struct {
	cfg      Config
	log      *slog.Logger
	ml       *memberlist.Memberlist
	tr       *transport
	delegate delegate
	queue    *queue
	met      *metrics
	// keyring is memberlist's (nil: plaintext gossip); keysMu
	// serializes its reloads (keys.go).
	keyring *memberlist.Keyring
	keysMu  sync.Mutex

	mu      sync.Mutex
	members map[string]*entry
	seq     uint64 // counts memberlist's notifications
	closed  bool

	lifecycle sync.Mutex // serializes Leave and Shutdown
	stopped   bool
	done      chan struct{}
	wg        sync.WaitGroup
}

type entry struct {
	Member
	meta    []byte // as received, to tell an update from a repeat
	leaving bool   // its metadata says it is leaving
	seq     uint64 // m.seq at its last memberlist notification
}

// New starts a member: it listens, and probes the members it learns of.
// It joins no one; call Join.
func New(cfg Config) (*Members, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	meta, err := cfg.Meta.encode(false)
	if err != nil {
		return nil, fmt.Errorf("membership: %w", err)
	}
	m := &Members{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "membership", "member", cfg.Name),
		queue:   newQueue(cfg.EventQueueLimit),
		members: map[string]*entry{},
		done:    make(chan struct{}),
	}
	m.met = newMetrics(m) // before memberlist starts: it reports this member's join at once
	mlLog := memberlistLogger(cfg.Logger)
	tr, err := newTransport(&cfg, mlLog)
	if err != nil {
		return nil, err
	}
	m.tr = tr
	mc := cfg.memberlistConfig()
	mc.BindPort = tr.port()
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = tr.port()
	}
	mc.Transport = tr
	if m.keyring, err = keyring(cfg.Keys); err != nil {
		tr.Shutdown()
		return nil, err
	}
	mc.Keyring = m.keyring
	mc.Logger = mlLog
	m.delegate.meta.Store(&meta)
	mc.Delegate = &m.delegate
	mc.Events = events{m}
	ml, err := memberlist.Create(mc)
	if err != nil {
		tr.Shutdown()
		return nil, fmt.Errorf("membership: starting memberlist: %w", err)
	}
	m.ml = ml
	if err := m.met.register(cfg.Registry); err != nil {
		ml.Shutdown()
		return nil, fmt.Errorf("membership: registering metrics: %w", err)
	}
	m.wg.Add(3)
	go func() { defer m.wg.Done(); m.queue.run(m.done, cfg.Clock.Now) }()
	go func() { defer m.wg.Done(); m.pollStates() }()
	go func() { defer m.wg.Done(); m.reconnect() }()
	if cfg.KeyFile != "" && m.keyring != nil {
		m.wg.Add(1)
		go func() { defer m.wg.Done(); m.watchKeys() }()
	}
	m.log.Info("member started", "addr", m.Local().Addr, "role", cfg.Meta.Role, "domain", cfg.Meta.Domain,
		"encrypted", m.keyring != nil, "label", cfg.Label)
	return m, nil
}

// Join contacts the seeds (Config.Seeds when none are given) and merges
// their view of the cluster. It returns how many seeds answered; an error
// only when none did.
func (m *Members) Join(ctx context.Context, seeds ...string) (int, error) {
	if len(seeds) == 0 {
		seeds = m.cfg.Seeds
	}
	if len(seeds) == 0 {
		return 0, errors.New("membership: join: no seeds")
	}
	type result struct {
		n   int
		err error
	}
	ch := make(chan result, 1)
	go func() { // memberlist's Join takes no context; it is bounded by TCPTimeout per seed
		n, err := m.ml.Join(seeds)
		ch <- result{n, err}
	}()
	select {
	case r := <-ch:
		if r.n == 0 {
			return 0, fmt.Errorf("membership: join %v: %w", seeds, r.err)
		}
		return r.n, nil
	case <-ctx.Done():
		return 0, fmt.Errorf("membership: join %v: %w", seeds, ctx.Err())
	}
}

// Leave tells the others this member is leaving (they see EventLeave, and
// stop counting it as known), waits for the message to spread or ctx to
// end (1 s without a deadline), then shuts down.
func (m *Members) Leave(ctx context.Context) error {
	timeout := time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	err := m.leave(timeout)
	if serr := m.Shutdown(); err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("membership: leave: %w", err)
	}
	return nil
}

func (m *Members) leave(timeout time.Duration) error {
	m.lifecycle.Lock()
	defer m.lifecycle.Unlock()
	if m.stopped {
		return errors.New("already shut down") // memberlist panics on a leave after shutdown
	}
	// First metadata marked leaving, so that the others can tell the
	// leave that follows from a death (see NotifyLeave).
	meta, err := m.cfg.Meta.encode(true)
	if err != nil {
		return err
	}
	m.delegate.meta.Store(&meta)
	if err := m.ml.UpdateNode(timeout / 2); err != nil {
		return err
	}
	return m.ml.Leave(timeout / 2)
}

// Shutdown stops the member without telling anyone: the others declare it
// dead, as if it had crashed. Events is closed; undelivered events are
// dropped.
func (m *Members) Shutdown() error {
	m.lifecycle.Lock()
	defer m.lifecycle.Unlock()
	if m.stopped {
		return nil
	}
	m.stopped = true
	err := m.ml.Shutdown()
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	close(m.done)
	m.wg.Wait()
	m.log.Info("member stopped")
	return err
}

// Events delivers every change this member sees, in the order it saw them,
// to one reading goroutine (several would split the stream). The channel
// is closed by Shutdown. Changes wait in a queue while nobody reads, up to
// Config.EventQueueLimit (then EventLost).
func (m *Members) Events() <-chan Event { return m.queue.out }

// Members returns every member this one knows, itself included, dead and
// left ones too, sorted by name, in a new slice the caller owns.
func (m *Members) Members() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Member, 0, len(m.members))
	for _, e := range m.members {
		out = append(out, e.Member)
	}
	slices.SortFunc(out, func(a, b Member) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// Member returns the named member.
func (m *Members) Member(name string) (Member, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.members[name]
	if !ok {
		return Member{}, false
	}
	return e.Member, true
}

// Local returns this member.
func (m *Members) Local() Member {
	mem, _ := m.Member(m.cfg.Name)
	return mem
}

// Forget removes a dead member from the view, so that it no longer counts
// as known (for quorum) and is no longer reconnected: the coordinator
// calls it once the member's work has been moved elsewhere.
func (m *Members) Forget(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.members[name]
	if !ok {
		return fmt.Errorf("membership: forget %s: not a member", name)
	}
	if e.State == StateAlive || e.State == StateSuspect {
		return fmt.Errorf("membership: forget %s: it is %s", name, e.State)
	}
	delete(m.members, name)
	return nil
}

// HealthScore is memberlist's local health (Lifeguard): 0 is healthy;
// higher means this member is missing acks and has slowed its probes.
func (m *Members) HealthScore() int { return m.ml.GetHealthScore() }

func nodeAddr(n *memberlist.Node) string {
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}
