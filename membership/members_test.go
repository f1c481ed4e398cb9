package membership

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"rewind.dev/rewind/internal/wait"
)

func TestJoinSpreadsMetadata(t *testing.T) {
	c := newCluster(t, 3)
	for _, o := range c.names {
		got := c.members[o].Members()
		if len(got) != 3 {
			t.Fatalf("%s sees %d members, want 3: %+v", o, len(got), got)
		}
		for _, mem := range got {
			want := testConfig(t, mem.Name).Meta
			if mem.Meta != want || mem.MetaErr != nil {
				t.Errorf("%s sees %s with meta %+v (err %v), want %+v", o, mem.Name, mem.Meta, mem.MetaErr, want)
			}
			if mem.Addr != c.members[mem.Name].Local().Addr {
				t.Errorf("%s sees %s at %s, it is at %s", o, mem.Name, mem.Addr, c.members[mem.Name].Local().Addr)
			}
		}
		if !c.members[o].HasQuorum(3) {
			t.Errorf("%s has no quorum with everyone alive", o)
		}
	}
	if ev, ok := c.recs["m0"].first("m2", EventJoin); !ok || ev.Member.Meta.Domain != "rack-m2" {
		t.Errorf("m0 saw no join of m2 carrying its metadata: %+v", ev)
	}
}

// TestCrashDetected shuts a member down without a word and checks that
// every other member suspects it and then declares it dead, within three
// times the documented bound.
func TestCrashDetected(t *testing.T) {
	const n = 5
	c := newCluster(t, n)
	victim := "m3"
	bound := c.cfg.DetectionBound(n)
	start := time.Now()
	c.members[victim].Shutdown()
	survivors := except(c.names, victim)
	waitFor(t, 3*bound, func() string {
		for _, o := range survivors {
			if _, ok := c.recs[o].first(victim, EventDead); !ok {
				return fmt.Sprintf("%s saw %s go %v", o, victim, kinds(c.recs[o].about(victim)))
			}
		}
		return ""
	})

	// Suspected before declared dead: the first death comes at least a
	// suspicion timeout after the first suspicion. Polls see a suspicion
	// up to an interval late, more on a loaded machine, so the test asks
	// for half of it. A survivor that missed the suspect gossip may see
	// only the death.
	var took []time.Duration
	var firstSuspect, firstDead time.Time
	for _, o := range survivors {
		dead, _ := c.recs[o].first(victim, EventDead)
		took = append(took, dead.At.Sub(start))
		if firstDead.IsZero() || dead.At.Before(firstDead) {
			firstDead = dead.At
		}
		if sus, ok := c.recs[o].first(victim, EventSuspect); ok && sus.At.Before(dead.At) {
			if firstSuspect.IsZero() || sus.At.Before(firstSuspect) {
				firstSuspect = sus.At
			}
		}
		if !c.members[o].HasQuorum(n) {
			t.Errorf("%s lost quorum with 4 of 5 alive", o)
		}
	}
	minSuspicion, _ := c.cfg.SuspicionTimeout(n)
	if firstSuspect.IsZero() {
		t.Errorf("no survivor saw %s suspected before dead", victim)
	} else if gap := firstDead.Sub(firstSuspect); gap < minSuspicion/2 {
		t.Errorf("%s was declared dead %v after it was first seen suspected, want at least %v",
			victim, gap, minSuspicion/2)
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("crash of 1 of %d detected after: first %v, median %v, last %v (bound %v)",
		n, took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond),
		took[len(took)-1].Round(time.Millisecond), bound)
}

// TestPartition cuts a 5-member cluster into 3 and 2: the majority keeps
// quorum, the minority loses it, in both the gossip view and by direct
// pings; healing brings everyone back.
func TestPartition(t *testing.T) {
	const n = 5
	c := newCluster(t, n)
	major, minor := c.names[:3], c.names[3:]
	bound := c.cfg.DetectionBound(n)
	start := time.Now()
	c.faults.Partition(major, minor)

	// Direct pings see the partition at once, before failure detection.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, o := range c.names {
		q, err := c.members[o].CheckQuorum(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := slices.Contains(major, o); q.OK != want {
			t.Errorf("%s: CheckQuorum OK %v, want %v (reached %v)", o, q.OK, want, q.Reached)
		}
	}

	// Until the minority has declared the whole majority dead, its gossip
	// view may still count some of it alive: direct pings never do.
	staleView := false
	waitFor(t, 3*bound, func() string {
		for _, o := range minor {
			sawDeath := slices.ContainsFunc(c.members[o].Members(), func(mem Member) bool { return mem.State == StateDead })
			if sawDeath && c.members[o].HasQuorum(n) {
				staleView = true
			}
			if q, err := c.members[o].CheckQuorum(ctx, nil); err != nil || q.OK {
				t.Fatalf("%s in the minority: CheckQuorum %+v, %v", o, q, err)
			}
		}
		for _, side := range [][2][]string{{major, minor}, {minor, major}} {
			for _, o := range side[0] {
				for _, far := range side[1] {
					if mem, _ := c.members[o].Member(far); mem.State != StateDead {
						return fmt.Sprintf("%s sees %s %v", o, far, mem.State)
					}
				}
			}
		}
		return ""
	})
	split := time.Since(start)
	t.Logf("minority's gossip view had quorum after it saw a death: %v", staleView)
	for _, o := range c.names {
		want := slices.Contains(major, o)
		if got := c.members[o].HasQuorum(n); got != want {
			t.Errorf("%s: HasQuorum %v, want %v", o, got, want)
		}
		job := []string{"m1", "m2", "m3"} // a job on both sides: only the side with 2 of its 3 nodes may restore it
		if got := c.members[o].HasQuorumOf(job); got != want {
			t.Errorf("%s: HasQuorumOf(%v) %v, want %v", o, job, got, want)
		}
	}

	start = time.Now()
	c.faults.Heal()
	c.waitAlive(c.names, c.names, 30*time.Second) // generous: under a loaded machine rejoining takes longer
	t.Logf("partition 3|2: every member saw the other side dead after %v; after healing, all alive again after %v",
		split.Round(10*time.Millisecond), time.Since(start).Round(10*time.Millisecond))
	for _, o := range c.names {
		if !c.members[o].HasQuorum(n) {
			t.Errorf("%s has no quorum after healing", o)
		}
		if _, ok := c.recs[o].first(c.names[0], EventJoin); !ok && o != c.names[0] {
			t.Errorf("%s saw no join of %s", o, c.names[0])
		}
	}
}

// TestSlowMemberSuspectedNotDead makes one member send everything late,
// later than a whole probe interval (so every probe of it fails) but well
// within the suspicion timeout: it is suspected, refutes, and is never
// declared dead.
func TestSlowMemberSuspectedNotDead(t *testing.T) {
	const n = 4
	c := newCluster(t, n)
	slow := "m2"
	c.faults.Slow(slow, c.cfg.ProbeInterval+50*time.Millisecond)
	others := except(c.names, slow)
	waitFor(t, 3*c.cfg.DetectionBound(n), func() string {
		for _, o := range others {
			if _, ok := c.recs[o].first(slow, EventSuspect); ok {
				return ""
			}
		}
		return "nobody suspected the slow member"
	})
	// The member stays slow as long again as an unconfirmed suspicion, and
	// more: had a suspicion of it gone unrefuted, it would be dead by then.
	wait.Holds(t, 2*time.Second, "the slow member never declared dead", func() error {
		for _, o := range others {
			if _, dead := c.recs[o].first(slow, EventDead); dead {
				return fmt.Errorf("%s declared it dead: %v", o, kinds(c.recs[o].about(slow)))
			}
		}
		return nil
	})
	c.faults.Heal()
	c.waitAlive(c.names, c.names, 5*time.Second)
	for _, o := range others {
		evs := c.recs[o].about(slow)
		if _, dead := c.recs[o].first(slow, EventDead); dead {
			t.Errorf("%s declared the slow member dead: %v", o, kinds(evs))
		}
		t.Logf("%s saw %s: %v", o, slow, kinds(evs))
	}
}

func TestLeaveAndForget(t *testing.T) {
	c := newCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.members["m2"].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.members["m2"].Leave(ctx); err == nil {
		t.Error("a second Leave, after shutdown, succeeded")
	}
	c.waitState([]string{"m0", "m1"}, []string{"m2"}, StateLeft, 5*time.Second)
	if _, ok := c.recs["m0"].first("m2", EventLeave); !ok {
		t.Errorf("m0 saw no leave: %v", kinds(c.recs["m0"].about("m2")))
	}
	// Two of the two members still known: a graceful leave shrinks the cluster.
	if !c.members["m0"].HasQuorum(0) {
		t.Error("m0 has no quorum after m2 left")
	}
	if err := c.members["m0"].Forget("m1"); err == nil {
		t.Error("forgot an alive member")
	}
	if err := c.members["m0"].Forget("m2"); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.members["m0"].Member("m2"); ok {
		t.Error("m2 still in the view after Forget")
	}
}

// TestRestartRejoins restarts a crashed member under the same name and
// address, as a restarted agent is: the others see it dead, then join again.
func TestRestartRejoins(t *testing.T) {
	c := newCluster(t, 3)
	victim := "m2"
	addr := c.members[victim].Local().Addr
	c.members[victim].Shutdown()
	c.waitState([]string{"m0", "m1"}, []string{victim}, StateDead, 3*c.cfg.DetectionBound(3))

	cfg := testConfig(t, victim)
	cfg.Faults = c.faults
	_, port, _ := net.SplitHostPort(addr)
	cfg.BindPort, _ = strconv.Atoi(port)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := m.Join(ctx, c.members["m0"].Local().Addr); err != nil {
		t.Fatal(err)
	}
	c.members[victim] = m
	c.waitAlive(c.names, c.names, 5*time.Second)
	waitFor(t, 5*time.Second, func() string {
		evs := kinds(c.recs["m0"].about(victim))
		if !slices.Equal(evs[max(0, len(evs)-2):], []EventKind{EventDead, EventJoin}) {
			return fmt.Sprintf("m0 saw %s go %v, want it to end dead, join", victim, evs)
		}
		return ""
	})
}

// TestUnreadEventsNeverBlock: a member whose events nobody reads still
// follows the cluster, and its reader, when it comes, learns what it lost.
func TestUnreadEventsNeverBlock(t *testing.T) {
	c := newCluster(t, 3)
	cfg := testConfig(t, "m9")
	cfg.EventQueueLimit = 2
	m, err := New(cfg) // not recorded: nobody reads its events yet
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := m.Join(ctx, c.members["m0"].Local().Addr); err != nil {
		t.Fatal(err)
	}
	c.members["m9"] = m
	c.waitAlive([]string{"m9"}, c.names, 5*time.Second) // four joins, more than the queue holds
	c.members["m1"].Shutdown()
	c.waitState([]string{"m9"}, []string{"m1"}, StateDead, 3*c.cfg.DetectionBound(4))
	// Delivered: the event the queue held when it filled, EventLost for
	// the oldest ones dropped, then the newest two: m1 suspected, m1 dead.
	var got []Event
	for len(got) < 4 {
		select {
		case ev := <-m.Events():
			got = append(got, ev)
		case <-time.After(time.Second):
			t.Fatalf("events stopped at %v", kinds(got))
		}
	}
	if got[1].Kind != EventLost || got[1].Lost == 0 {
		t.Errorf("events %v (lost %d), want the second to report lost events", kinds(got), got[1].Lost)
	}
	if last := got[3]; last.Kind != EventDead || last.Member.Name != "m1" {
		t.Errorf("last event %v %s, want dead m1", last.Kind, last.Member.Name)
	}
}
