package membership

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"rewind.dev/rewind/faultinject"
)

// transport is memberlist's NetTransport (UDP packets, TCP streams) with
// two additions: a FaultNetwork, when configured, may drop, refuse or
// delay what this member sends; and this package can hand memberlist an
// in-process stream (snapshot.go) beside the accepted TCP ones.
//
// memberlist calls it from many goroutines; every method is safe for
// concurrent use.
type transport struct {
	name    string
	inner   *memberlist.NetTransport
	faults  *FaultNetwork // nil: no faults
	inj     *faultinject.Injector
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

var _ memberlist.Transport = (*transport)(nil)

func newTransport(cfg *Config, logger *log.Logger) (*transport, error) {
	inner, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{cfg.BindAddr},
		BindPort:  cfg.BindPort,
		Logger:    logger,
	})
	if err != nil {
		return nil, fmt.Errorf("membership: listening on %s: %w",
			net.JoinHostPort(cfg.BindAddr, strconv.Itoa(cfg.BindPort)), err)
	}
	t := &transport{
		name:    cfg.Name,
		inner:   inner,
		faults:  cfg.Faults,
		inj:     cfg.Injector,
		streams: make(chan net.Conn),
		done:    make(chan struct{}),
	}
	t.wg.Add(1)
	go t.forwardStreams()
	return t, nil
}

// port is the port the transport is bound to (the one chosen when the
// configuration asked for 0).
func (t *transport) port() int { return t.inner.GetAutoBindPort() }

func (t *transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	addr, p, err := t.inner.FinalAdvertiseAddr(ip, port)
	if err == nil && t.faults != nil {
		t.faults.register(t.name, net.JoinHostPort(addr.String(), strconv.Itoa(p)))
	}
	return addr, p, err
}

// closedErr reports whether Shutdown has begun: nothing is sent after it,
// so a member shut down to simulate a crash is silent at once.
func (t *transport) closedErr() error {
	select {
	case <-t.done:
		return errTransportClosed
	default:
		return nil
	}
}

func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	if err := t.closedErr(); err != nil {
		return time.Time{}, err
	}
	if f := t.inj.Eval(context.Background(), faultinject.GossipSend); f.Kind == faultinject.KindDrop || f.Kind == faultinject.KindReset {
		return time.Now(), nil // lost
	}
	if t.faults == nil {
		return t.inner.WriteTo(b, addr)
	}
	_, cut, delay := t.faults.link(t.name, addr)
	now := time.Now()
	switch {
	case cut:
		return now, nil // lost, as a datagram on a cut link is
	case delay > 0:
		buf := append([]byte(nil), b...)
		time.AfterFunc(delay, func() {
			select {
			case <-t.done:
				return
			default:
			}
			if _, cut, _ := t.faults.link(t.name, addr); !cut {
				t.inner.WriteTo(buf, addr) // a late datagram may be lost; memberlist copes
			}
		})
		return now, nil
	}
	return t.inner.WriteTo(b, addr)
}

func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.inner.PacketCh() }

func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if err := t.closedErr(); err != nil {
		return nil, err
	}
	if f := t.inj.Eval(context.Background(), faultinject.GossipSend); f.Kind == faultinject.KindDrop || f.Kind == faultinject.KindReset {
		return nil, fmt.Errorf("dialing %s: %w", addr, &faultinject.Error{Point: f.Point, Err: ErrLinkCut})
	}
	if t.faults == nil {
		return t.inner.DialTimeout(addr, timeout)
	}
	to, cut, _ := t.faults.link(t.name, addr)
	if cut {
		return nil, fmt.Errorf("dialing %s (%s): %w", to, addr, ErrLinkCut)
	}
	conn, err := t.inner.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	c := &faultConn{Conn: conn, net: t.faults, local: t.name, remote: to}
	if !t.faults.track(c) {
		conn.Close()
		return nil, fmt.Errorf("dialing %s (%s): %w", to, addr, ErrLinkCut)
	}
	return c, nil
}

func (t *transport) StreamCh() <-chan net.Conn { return t.streams }

// forwardStreams passes the streams NetTransport accepted on to memberlist.
func (t *transport) forwardStreams() {
	defer t.wg.Done()
	for {
		select {
		case conn := <-t.inner.StreamCh():
			if t.faults != nil {
				conn = &faultConn{Conn: conn, net: t.faults, local: t.name}
			}
			if t.inj != nil {
				conn = &injectedConn{Conn: conn, inj: t.inj}
			}
			select {
			case t.streams <- conn:
			case <-t.done:
				conn.Close()
				return
			}
		case <-t.done:
			return
		}
	}
}

// injectedConn is a stream this member accepted: gossip/send fires on
// what it writes there too (an ack to a TCP ping, a push/pull answer), or
// a member whose sends are all dropped would still answer the others'
// TCP pings and reconnects, and never be declared dead.
type injectedConn struct {
	net.Conn
	inj *faultinject.Injector
}

func (c *injectedConn) Write(b []byte) (int, error) {
	if f := c.inj.Eval(context.Background(), faultinject.GossipSend); f.Kind == faultinject.KindDrop || f.Kind == faultinject.KindReset {
		c.Conn.Close()
		return 0, fmt.Errorf("writing to %s: %w", c.RemoteAddr(), &faultinject.Error{Point: f.Point, Err: ErrLinkCut})
	}
	return c.Conn.Write(b)
}

// errTransportClosed is returned by openLocal after Shutdown.
var errTransportClosed = errors.New("membership: transport shut down")

// openLocal hands memberlist one end of an in-process stream, as if a peer
// had connected, and returns the other end.
func (t *transport) openLocal(timeout time.Duration) (net.Conn, error) {
	ours, theirs := net.Pipe()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case t.streams <- pipeConn{theirs}:
		return ours, nil
	case <-t.done:
		err := errTransportClosed
		ours.Close()
		theirs.Close()
		return nil, err
	case <-timer.C:
		ours.Close()
		theirs.Close()
		return nil, fmt.Errorf("membership: memberlist took no stream within %v", timeout)
	}
}

func (t *transport) Shutdown() error {
	var err error
	t.once.Do(func() {
		close(t.done)
		t.wg.Wait()
		// memberlist has stopped reading; NetTransport's listeners may be
		// blocked handing over a last packet or stream, and its Shutdown
		// waits for them.
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case conn := <-t.inner.StreamCh():
					conn.Close()
				case <-t.inner.PacketCh():
				case <-stop:
					return
				}
			}
		}()
		err = t.inner.Shutdown()
		close(stop)
	})
	return err
}

// snapshotAddr names the in-process stream in memberlist's logs.
const snapshotAddr = "membership-snapshot"

type pipeConn struct{ net.Conn }

func (pipeConn) RemoteAddr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return snapshotAddr }
