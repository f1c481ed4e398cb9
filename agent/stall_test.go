package agent

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// TestPeerCopyFromAStalledPeerFails: a peer that stops sending (a
// paused node: its kernel keeps the connection open) must fail the copy
// within peerStall, not hold it, and the rank's copy lock, until the
// caller's deadline; a restore of the rank waits for that lock.
func TestPeerCopyFromAStalledPeerFails(t *testing.T) {
	defer func(d time.Duration) { peerStall = d }(peerStall)
	peerStall = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const size = 1 << 20
	stalled := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		var hdr [8]byte // the request: magic, length, body
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[4:]))); err != nil {
			return
		}
		var ok [9]byte // status 0, then the size
		binary.BigEndian.PutUint64(ok[1:], size)
		_, _ = c.Write(ok[:]) // the shard's bytes never come
		stalled <- c          // kept open, never written again
	}()
	a := &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ps := PeerShard{Job: "j", Rank: 0, WorldSize: 1, Step: 1, Size: size, HeaderSum: "x", Node: "paused", Addr: ln.Addr().String()}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // the caller's deadline, far beyond the stall bound
	defer cancel()
	start := time.Now()
	err = a.receiveData(ctx, ps, make([]byte, size), nil)
	took := time.Since(start)
	if c := <-stalled; c != nil {
		c.Close()
	}
	if err == nil {
		t.Fatal("a copy from a peer that stopped sending succeeded")
	}
	if took > 5*time.Second {
		t.Fatalf("a copy from a stalled peer failed only after %v (stall bound %v)", took, peerStall)
	}
	t.Logf("failed after %v: %v", took.Round(time.Millisecond), err)
}
