package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// stalledPeer listens for one data-path request, answers that a shard of
// size bytes follows, and then sends nothing, keeping the connection open
// until the test ends. answered is closed once the answer is sent: the
// copy then waits for bytes that never come.
func stalledPeer(t *testing.T, size int64) (addr string, answered <-chan struct{}) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	done := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		t.Cleanup(func() { c.Close() })
		var hdr [8]byte // the request: magic, length, body
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[4:]))); err != nil {
			return
		}
		var ok [9]byte // status 0, then the size; the shard's bytes never come
		binary.BigEndian.PutUint64(ok[1:], uint64(size))
		if _, err := c.Write(ok[:]); err == nil {
			close(done)
		}
	}()
	return ln.Addr().String(), done
}

// TestPeerCopyFromADeadNodeIsCut: a copy from a node this agent's failure
// detection declares dead ends at once, well before the stall bound.
func TestPeerCopyFromADeadNodeIsCut(t *testing.T) {
	const size = 1 << 20
	a := &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	addr, answered := stalledPeer(t, size)
	ps := PeerShard{Job: "j", Rank: 0, WorldSize: 1, Step: 1, Size: size, HeaderSum: "x", Node: "paused", Addr: addr}
	ctx, done := a.peers.copyContext(t.Context(), ps.Node)
	defer done()
	errc := make(chan error, 1)
	go func() { errc <- a.receiveData(ctx, ps, make([]byte, size), nil) }()
	select { // the copy waits for bytes
	case <-answered:
	case err := <-errc:
		t.Fatalf("the copy ended before the peer answered: %v", err)
	}
	if n := a.peers.cutCopies("paused"); n != 1 {
		t.Fatalf("cut %d copies from the dead node, want 1", n)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("a copy cut off succeeded")
		}
	case <-time.After(peerStall / 2):
		t.Fatal("a copy from a node declared dead went on")
	}
	if n := a.peers.cutCopies("paused"); n != 0 {
		t.Fatalf("a second cut found %d copies", n)
	}
	// A copy that starts after the verdict (its order was queued before)
	// ends before it dials, until the node is back.
	late, lateDone := a.peers.copyContext(t.Context(), ps.Node)
	if !errors.Is(context.Cause(late), errPeerDead) {
		t.Fatalf("a copy from a node declared dead started: %v", context.Cause(late))
	}
	lateDone()
	a.peers.peerBack("paused")
	back, backDone := a.peers.copyContext(t.Context(), ps.Node)
	defer backDone()
	if err := back.Err(); err != nil {
		t.Fatalf("a copy from a node back again ended before it started: %v", err)
	}
}

// TestPeerCopyFromAStalledPeerFails: a peer that stops sending (a
// paused node: its kernel keeps the connection open) must fail the copy
// within peerStall, not hold it, and the rank's copy lock, until the
// caller's deadline; a restore of the rank waits for that lock.
func TestPeerCopyFromAStalledPeerFails(t *testing.T) {
	defer func(d time.Duration) { peerStall = d }(peerStall)
	peerStall = 300 * time.Millisecond
	const size = 1 << 20
	a := &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	addr, _ := stalledPeer(t, size)
	ps := PeerShard{Job: "j", Rank: 0, WorldSize: 1, Step: 1, Size: size, HeaderSum: "x", Node: "paused", Addr: addr}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // the caller's deadline, far beyond the stall bound
	defer cancel()
	start := time.Now()
	err := a.receiveData(ctx, ps, make([]byte, size), nil)
	took := time.Since(start)
	if err == nil {
		t.Fatal("a copy from a peer that stopped sending succeeded")
	}
	if took > 5*time.Second {
		t.Fatalf("a copy from a stalled peer failed only after %v (stall bound %v)", took, peerStall)
	}
	t.Logf("failed after %v: %v", took.Round(time.Millisecond), err)
}
