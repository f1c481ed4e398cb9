package membership

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// FaultNetwork cuts and slows the links between members that share it
// (Config.Faults), without root and without touching the real network:
// each member's transport asks it before sending a packet or dialing a
// stream. It is how tests partition a cluster. All methods are safe for
// concurrent use.
//
// A cut link drops packets both ways, refuses new streams both ways, and
// closes the streams the two members had dialed to each other. A slow
// member sends every packet and every stream write late.
type FaultNetwork struct {
	mu     sync.Mutex
	byAddr map[string]string        // advertised host:port → member name
	cuts   map[[2]string]bool       // unordered pairs of names, smaller first
	slow   map[string]time.Duration // member name → delay on all it sends
	conns  map[*faultConn]struct{}  // streams a member dialed, for Cut to close
}

// ErrLinkCut is returned when a member dials another across a cut link.
var ErrLinkCut = errors.New("membership: link cut by fault injection")

// NewFaultNetwork returns a network with every link up.
func NewFaultNetwork() *FaultNetwork {
	return &FaultNetwork{
		byAddr: map[string]string{},
		cuts:   map[[2]string]bool{},
		slow:   map[string]time.Duration{},
		conns:  map[*faultConn]struct{}{},
	}
}

func pair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// Cut cuts the link between members a and b.
func (f *FaultNetwork) Cut(a, b string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cutLocked(a, b)
}

func (f *FaultNetwork) cutLocked(a, b string) {
	if a == b {
		return
	}
	f.cuts[pair(a, b)] = true
	for c := range f.conns {
		if pair(c.local, c.remote) == pair(a, b) {
			c.Conn.Close()
			delete(f.conns, c)
		}
	}
}

// Partition cuts every link between members of different groups; links
// within a group, and of members in no group, stay as they are.
func (f *FaultNetwork) Partition(groups ...[]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, g := range groups {
		for _, h := range groups[i+1:] {
			for _, a := range g {
				for _, b := range h {
					f.cutLocked(a, b)
				}
			}
		}
	}
}

// Slow delays everything member name sends by d (0 restores it).
func (f *FaultNetwork) Slow(name string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d <= 0 {
		delete(f.slow, name)
		return
	}
	f.slow[name] = d
}

// Heal restores every link and every member's speed.
func (f *FaultNetwork) Heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.cuts)
	clear(f.slow)
}

// register records the address a member advertises, so packets and dials
// to that address can be matched to its name.
func (f *FaultNetwork) register(name, addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for a, n := range f.byAddr {
		if n == name {
			delete(f.byAddr, a)
		}
	}
	f.byAddr[addr] = name
}

// link tells what happens to traffic from member from to address addr:
// whether it is cut, and how late it leaves.
func (f *FaultNetwork) link(from, addr string) (to string, cut bool, delay time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	to = f.byAddr[addr]
	return to, to != "" && f.cuts[pair(from, to)], f.slow[from]
}

func (f *FaultNetwork) isCut(a, b string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cuts[pair(a, b)]
}

func (f *FaultNetwork) delay(from string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slow[from]
}

// track records a dialed stream so that a cut closes it; it reports false,
// closing nothing, when the link was cut in the meantime.
func (f *FaultNetwork) track(c *faultConn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.remote != "" && f.cuts[pair(c.local, c.remote)] {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *FaultNetwork) untrack(c *faultConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

// faultConn is a stream of member local: to remote when local dialed it,
// remote empty when local accepted it (the dialer's side enforces cuts).
// Writes leave late while local is slow.
type faultConn struct {
	net.Conn
	net    *FaultNetwork
	local  string
	remote string
	once   sync.Once
}

func (c *faultConn) Write(b []byte) (int, error) {
	if d := c.net.delay(c.local); d > 0 {
		time.Sleep(d)
	}
	if c.remote != "" && c.net.isCut(c.local, c.remote) {
		c.Close()
		return 0, fmt.Errorf("writing to %s: %w", c.remote, ErrLinkCut)
	}
	return c.Conn.Write(b)
}

func (c *faultConn) Close() error {
	c.once.Do(func() { c.net.untrack(c) })
	return c.Conn.Close()
}
