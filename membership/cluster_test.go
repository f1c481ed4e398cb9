package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"rewind.dev/rewind/internal/wait"
)

// testCluster is n members on loopback (real UDP and TCP on 127.0.0.1,
// free ports) sharing one FaultNetwork, each with its events recorded.
type testCluster struct {
	t       *testing.T
	cfg     Config
	faults  *FaultNetwork
	members map[string]*Members
	recs    map[string]*recorder
	names   []string
}

func testConfig(t *testing.T, name string) Config {
	cfg := DefaultConfig()
	cfg.Name = name
	cfg.BindAddr = "127.0.0.1"
	cfg.BindPort = 0
	cfg.Meta = Meta{Role: RoleAgent, Domain: "rack-" + name, GRPCAddr: "127.0.0.1:7" + name[len(name)-1:]}
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	return cfg
}

// newCluster starts n members named m0, m1, ... joined to m0, and waits
// until every one sees every other alive.
func newCluster(t *testing.T, n int) *testCluster {
	t.Helper()
	return startCluster(t, n, NewFaultNetwork(), nil)
}

// startCluster is newCluster on faults (nil: none), each member's
// configuration changed by mod when it is set.
func startCluster(t *testing.T, n int, faults *FaultNetwork, mod func(name string, cfg *Config)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, faults: faults, members: map[string]*Members{}, recs: map[string]*recorder{}}
	for i := range n {
		name := fmt.Sprintf("m%d", i)
		cfg := testConfig(t, name)
		cfg.Faults = c.faults
		if mod != nil {
			mod(name, &cfg)
		}
		m, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c.cfg = cfg
		c.members[name] = m
		c.recs[name] = record(m)
		c.names = append(c.names, name)
		t.Cleanup(func() { m.Shutdown() })
		if i > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := m.Join(ctx, c.members["m0"].Local().Addr)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	c.waitAlive(c.names, c.names, 10*time.Second)
	return c
}

// waitAlive waits until each observer sees each of names alive.
func (c *testCluster) waitAlive(observers, names []string, timeout time.Duration) {
	c.t.Helper()
	c.waitState(observers, names, StateAlive, timeout)
}

func (c *testCluster) waitState(observers, names []string, want State, timeout time.Duration) {
	c.t.Helper()
	waitFor(c.t, timeout, func() string {
		for _, o := range observers {
			for _, n := range names {
				if mem, ok := c.members[o].Member(n); !ok || mem.State != want {
					return fmt.Sprintf("%s sees %s %v (want %v)", o, n, mem.State, want)
				}
			}
		}
		return ""
	})
}

// waitFor waits until cond returns ""; until then cond's answer says what
// it sees, and the last one is the test's failure after timeout.
func waitFor(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	wait.ForNil(t, timeout, "the members' views", func() error {
		if why := cond(); why != "" {
			return errors.New(why)
		}
		return nil
	})
}

func except(names []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return slices.Contains(drop, n) })
}

// recorder keeps every event a member delivers.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func record(m *Members) *recorder {
	r := &recorder{}
	go func() {
		for ev := range m.Events() {
			r.mu.Lock()
			r.events = append(r.events, ev)
			r.mu.Unlock()
		}
	}()
	return r
}

// about returns the kinds of the events about member name, in order.
func (r *recorder) about(name string) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, ev := range r.events {
		if ev.Member.Name == name {
			out = append(out, ev)
		}
	}
	return out
}

// first returns the first event of kind about name.
func (r *recorder) first(name string, kind EventKind) (Event, bool) {
	for _, ev := range r.about(name) {
		if ev.Kind == kind {
			return ev, true
		}
	}
	return Event{}, false
}

func kinds(evs []Event) []EventKind {
	out := make([]EventKind, len(evs))
	for i, ev := range evs {
		out[i] = ev.Kind
	}
	return out
}
