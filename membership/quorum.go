package membership

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
)

// Partitions. The rule the coordinator follows before it acts on a death
// (plans a restore, re-gangs a job):
//
//	A member that cannot reach a strict majority of the last known members
//	must not trigger restores.
//
// "Last known members" are those this member has seen and that have not
// left gracefully or been forgotten (Forget): a dead member still counts,
// which is the point. Two sides of a partition cannot both hold a strict
// majority of the same set, so at most one side restores; with an even
// split neither does until the partition heals, or an operator restores
// by hand. Losing a majority of the cluster for real (not a partition)
// looks the same from inside, so it too waits for the members to return,
// for the lost ones to be forgotten once the re-gang driver has confirmed
// them gone, or for an operator.
//
// HasQuorum answers from the gossip view and costs nothing, but that view
// lags on a small side: memberlist marks a far member suspect only when a
// probe of it fails, and a side of s members probes any one of n others
// only about s/n times per interval. So the coordinator uses it as a quick
// refusal and confirms with CheckQuorum, which pings every member directly,
// right before it acts.

// HasQuorum reports whether this member sees a strict majority of the
// cluster alive: more than half of max(expected, known), where known
// counts the last known members, this one included. Suspected members do
// not count as alive.
func (m *Members) HasQuorum(expected int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	alive, known := 0, 0
	for _, e := range m.members {
		switch e.State {
		case StateAlive:
			alive++
			known++
		case StateSuspect, StateDead:
			known++
		}
	}
	return 2*alive > max(expected, known)
}

// HasQuorumOf reports whether a strict majority of the named members (a
// job's nodes, say) is alive in this member's view. Unknown names count as
// not alive.
func (m *Members) HasQuorumOf(names []string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	alive := 0
	for _, n := range names {
		if e, ok := m.members[n]; ok && e.State == StateAlive {
			alive++
		}
	}
	return 2*alive > len(names)
}

// Quorum is the result of CheckQuorum.
type Quorum struct {
	// Reached and Unreached partition the members checked, sorted.
	Reached, Unreached []string
	// OK: more than half were reached.
	OK bool
}

// pingAttempts is how many pings, each waiting ProbeTimeout for its ack,
// a member gets in CheckQuorum before it counts as unreached.
const pingAttempts = 3

// maxPingsInFlight bounds CheckQuorum's concurrent pings.
const maxPingsInFlight = 64

// CheckQuorum pings the named members (all last known members when names
// is nil) directly, each up to three times, and reports who answered; this
// member counts as reached. It returns an error only when ctx ends first.
func (m *Members) CheckQuorum(ctx context.Context, names []string) (Quorum, error) {
	targets := m.quorumTargets(names)
	var (
		mu   sync.Mutex
		q    Quorum
		wg   sync.WaitGroup
		sema = make(chan struct{}, maxPingsInFlight)
	)
	for name, addr := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := name == m.cfg.Name
			if !ok && addr != nil {
				select {
				case sema <- struct{}{}:
					ok = m.ping(ctx, name, addr)
					<-sema
				case <-ctx.Done():
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if ok {
				q.Reached = append(q.Reached, name)
			} else {
				q.Unreached = append(q.Unreached, name)
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Quorum{}, fmt.Errorf("membership: checking quorum: %w", err)
	}
	slices.Sort(q.Reached)
	slices.Sort(q.Unreached)
	q.OK = 2*len(q.Reached) > len(targets)
	return q, nil
}

// quorumTargets maps the members to check to their UDP addresses (nil for
// names never seen).
func (m *Members) quorumTargets(names []string) map[string]*net.UDPAddr {
	m.mu.Lock()
	defer m.mu.Unlock()
	if names == nil {
		for _, e := range m.members {
			if e.State != StateLeft {
				names = append(names, e.Name)
			}
		}
	}
	targets := make(map[string]*net.UDPAddr, len(names))
	for _, n := range names {
		targets[n] = nil
		if e, ok := m.members[n]; ok {
			if a, err := net.ResolveUDPAddr("udp", e.Addr); err == nil {
				targets[n] = a
			}
		}
	}
	return targets
}

func (m *Members) ping(ctx context.Context, name string, addr *net.UDPAddr) bool {
	for range pingAttempts {
		if ctx.Err() != nil {
			return false
		}
		if _, err := m.ml.Ping(name, addr); err == nil {
			return true
		}
	}
	return false
}
