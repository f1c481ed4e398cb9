package membership

import (
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/wait"
)

// newInjectedCluster starts n members named m0, m1, ... joined to m0, each
// with a fault injector of its own (Config.Injector, as a daemon started
// with --fault-injection has), and waits until every one sees every other
// alive. No FaultNetwork: the injector is the only fault.
func newInjectedCluster(t *testing.T, n int) (*testCluster, map[string]*faultinject.Injector) {
	t.Helper()
	injs := map[string]*faultinject.Injector{}
	c := startCluster(t, n, nil, func(name string, cfg *Config) {
		injs[name] = faultinject.New(cfg.Logger, uint64(len(injs)+1))
		cfg.Injector = injs[name]
	})
	return c, injs
}

// lastKind is the kind of the last event observer saw about name.
func (c *testCluster) lastKind(observer, name string) (EventKind, bool) {
	evs := c.recs[observer].about(name)
	if len(evs) == 0 {
		return 0, false
	}
	return evs[len(evs)-1].Kind, true
}

// TestInjectedSendDropIsDeath arms gossip/send=drop on one member: nothing
// it sends (packets, streams it dials, answers on streams it accepted)
// reaches anyone, as if it had crashed while still listening. The others
// declare it dead within the documented detection bound (3× for a loaded
// machine, as TestCrashDetected allows), and it stays dead while the fault
// is armed: their reconnect attempts must not bring it back. Once the fault
// is cleared it rejoins: the reconnect loop (ReconnectInterval) joins dead
// members again, and everyone sees everyone alive, each survivor having
// seen it go dead then join again.
func TestInjectedSendDropIsDeath(t *testing.T) {
	const n = 4
	c, injs := newInjectedCluster(t, n)
	victim := "m2"
	others := except(c.names, victim)
	bound := c.cfg.DetectionBound(n)

	start := time.Now()
	if err := injs[victim].Set(faultinject.GossipSend + "=drop"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*bound, func() string {
		for _, o := range others {
			if _, ok := c.recs[o].first(victim, EventDead); !ok {
				return fmt.Sprintf("%s saw %s go %v", o, victim, kinds(c.recs[o].about(victim)))
			}
		}
		return ""
	})
	var took []time.Duration
	for _, o := range others {
		dead, _ := c.recs[o].first(victim, EventDead)
		took = append(took, dead.At.Sub(start))
	}
	slices.Sort(took)
	t.Logf("a member whose sends are all dropped was declared dead after: first %v, last %v (bound %v)",
		took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), bound)
	if injs[victim].Hits()[faultinject.GossipSend] == 0 {
		t.Fatal("gossip/send never fired: the injector is not on the member's sends")
	}

	// Still armed: for several reconnect rounds and a suspicion timeout,
	// the others keep it dead. A member that cannot send must not be seen
	// alive (it would be counted for quorum and trusted with shards).
	hold := 3*c.cfg.ReconnectInterval + bound
	wait.Holds(t, hold, victim+" dead to the others while every send of it is dropped", func() error {
		for _, o := range others {
			if mem, _ := c.members[o].Member(victim); mem.State != StateDead {
				return fmt.Errorf("%s sees it %v %v after it was declared dead (events %v)",
					o, mem.State, time.Since(start).Round(time.Millisecond), kinds(c.recs[o].about(victim)))
			}
		}
		return nil
	})
	for _, o := range others {
		if !c.members[o].HasQuorum(n) {
			t.Errorf("%s lost quorum with 3 of 4 alive", o)
		}
	}

	injs[victim].Clear()
	healed := time.Now()
	c.waitAlive(c.names, c.names, 10*time.Second)
	t.Logf("after the fault was cleared, all alive again after %v", time.Since(healed).Round(10*time.Millisecond))
	for _, o := range others {
		evs := kinds(c.recs[o].about(victim))
		i := slices.Index(evs, EventDead)
		if i < 0 || !slices.Contains(evs[i:], EventJoin) {
			t.Errorf("%s saw %s go %v, want dead and then a join", o, victim, evs)
		}
		if k, _ := c.lastKind(o, victim); k == EventDead {
			t.Errorf("%s's last event about %s is a death", o, victim)
		}
	}
}

// TestInjectedSendSleepIsSlowNotDead arms gossip/send=sleep(30ms) on one
// member: everything it sends is late (less than the probe timeout), so it
// is slow, never dead. The delay is real (a ping's round trip to it takes
// at least the delay), and over twice the detection bound nobody declares
// it dead.
func TestInjectedSendSleepIsSlowNotDead(t *testing.T) {
	const n = 4
	c, injs := newInjectedCluster(t, n)
	slow := "m1"
	others := except(c.names, slow)
	const delay = 30 * time.Millisecond
	if err := injs[slow].Set(fmt.Sprintf("%s=sleep(%v)", faultinject.GossipSend, delay)); err != nil {
		t.Fatal(err)
	}
	mem, ok := c.members["m0"].Member(slow)
	if !ok {
		t.Fatalf("m0 does not know %s", slow)
	}
	addr, err := net.ResolveUDPAddr("udp", mem.Addr)
	if err != nil {
		t.Fatal(err)
	}
	// The round trip is timed around the call: memberlist's own figure
	// starts after its send returns, so a loaded machine that delays the
	// pinging goroutine makes it shorter than the delay.
	start := time.Now()
	if _, err := c.members["m0"].ml.Ping(slow, addr); err != nil {
		t.Fatalf("ping of the slow member: %v", err)
	}
	rtt := time.Since(start)
	if rtt < delay {
		t.Fatalf("ping of a member that sends everything %v late answered in %v", delay, rtt)
	}
	t.Logf("ping of the slow member: %v", rtt)

	wait.Holds(t, 2*c.cfg.DetectionBound(n), fmt.Sprintf("a member %v slow never dead", delay), func() error {
		for _, o := range others {
			if _, dead := c.recs[o].first(slow, EventDead); dead {
				return fmt.Errorf("%s declared it dead: %v", o, kinds(c.recs[o].about(slow)))
			}
			if mem, _ := c.members[o].Member(slow); mem.State == StateDead {
				return fmt.Errorf("%s sees it dead", o)
			}
		}
		return nil
	})
	if h := injs[slow].Hits()[faultinject.GossipSend]; h < 10 {
		t.Fatalf("gossip/send fired %d times in %v: the member was not slowed", h, 2*c.cfg.DetectionBound(n))
	}
	injs[slow].Clear()
	c.waitAlive(c.names, c.names, 5*time.Second)
}
