package membership

import (
	"errors"
	"io"
	"log"
	"net"
	"strconv"
	"testing"
	"time"
)

// transportPair starts transports a and b on loopback sharing faults.
func transportPair(t *testing.T, faults *FaultNetwork) (a, b *transport, addrA, addrB string) {
	t.Helper()
	start := func(name string) (*transport, string) {
		cfg := DefaultConfig()
		cfg.Name, cfg.BindAddr, cfg.BindPort, cfg.Faults = name, "127.0.0.1", 0, faults
		tr, err := newTransport(&cfg, log.New(io.Discard, "", 0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Shutdown() })
		ip, port, err := tr.FinalAdvertiseAddr("", 0)
		if err != nil {
			t.Fatal(err)
		}
		return tr, net.JoinHostPort(ip.String(), strconv.Itoa(port))
	}
	a, addrA = start("a")
	b, addrB = start("b")
	return a, b, addrA, addrB
}

// received reports whether tr gets a packet within wait.
func received(tr *transport, wait time.Duration) bool {
	select {
	case <-tr.PacketCh():
		return true
	case <-time.After(wait):
		return false
	}
}

func TestFaultNetworkPackets(t *testing.T) {
	faults := NewFaultNetwork()
	a, b, addrA, addrB := transportPair(t, faults)
	send := func(from *transport, to string) {
		t.Helper()
		if _, err := from.WriteTo([]byte("ping"), to); err != nil {
			t.Fatal(err)
		}
	}
	send(a, addrB)
	if !received(b, 2*time.Second) {
		t.Fatal("packet lost with the link up")
	}
	faults.Cut("a", "b")
	send(a, addrB)
	send(b, addrA)
	if received(b, 200*time.Millisecond) || received(a, 200*time.Millisecond) {
		t.Fatal("packet crossed a cut link")
	}
	faults.Heal()
	faults.Slow("a", 300*time.Millisecond)
	sent := time.Now()
	send(a, addrB)
	if !received(b, 2*time.Second) {
		t.Fatal("packet from a slow member lost")
	}
	if d := time.Since(sent); d < 300*time.Millisecond {
		t.Fatalf("packet from a member slowed by 300ms arrived after %v", d)
	}
	faults.Heal()
	faults.Partition([]string{"a"}, []string{"b", "c"})
	send(b, addrA)
	if received(a, 200*time.Millisecond) {
		t.Fatal("packet crossed a partition")
	}
}

func TestFaultNetworkStreams(t *testing.T) {
	faults := NewFaultNetwork()
	a, b, _, addrB := transportPair(t, faults)
	conn, err := a.DialTimeout(addrB, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var accepted net.Conn
	select {
	case accepted = <-b.StreamCh():
	case <-time.After(2 * time.Second):
		t.Fatal("b accepted no stream")
	}
	defer accepted.Close()

	faults.Cut("b", "a")
	// The dialer's end is closed, so the accepting end sees EOF.
	accepted.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := accepted.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read on a stream across a cut link: %v, want EOF", err)
	}
	if _, err := conn.Write([]byte("x")); err == nil {
		t.Fatal("wrote on a stream across a cut link")
	}
	if _, err := a.DialTimeout(addrB, time.Second); !errors.Is(err, ErrLinkCut) {
		t.Fatalf("dial across a cut link: %v, want ErrLinkCut", err)
	}
	faults.Heal()
	conn2, err := a.DialTimeout(addrB, time.Second)
	if err != nil {
		t.Fatalf("dial after Heal: %v", err)
	}
	conn2.Close()
}

func TestTransportSilentAfterShutdown(t *testing.T) {
	a, _, _, addrB := transportPair(t, nil)
	a.Shutdown()
	if _, err := a.WriteTo([]byte("x"), addrB); !errors.Is(err, errTransportClosed) {
		t.Fatalf("WriteTo after Shutdown: %v", err)
	}
	if _, err := a.DialTimeout(addrB, time.Second); !errors.Is(err, errTransportClosed) {
		t.Fatalf("DialTimeout after Shutdown: %v", err)
	}
}
