package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// The peer data path. A shard copied between agents (a replica, a restore
// from a peer's memory) is the bulk of recovery's data movement; over gRPC
// it is split into 1 MiB messages, copied several times and framed in
// 16 KiB HTTP/2 frames, which reaches about a third of what the loopback
// link carries. So the agent's TCP port also speaks a plain protocol,
// told apart from gRPC by its first four bytes:
//
//	request:  "RWND" uint32(len) JSON{job, rank, step}
//	answer:   byte(0) uint64(size) followed by the shard's bytes, written
//	          straight from the mapping; or byte(1) uint32(len) message
//
// The receiver reads straight into its own mapped segment and checks every
// checksum before it commits. The holder pins and verifies the shard
// first, as for a gRPC Read.

var dataMagic = [4]byte{'R', 'W', 'N', 'D'}

type dataRequest struct {
	Job  string `json:"job"`
	Rank uint32 `json:"rank"`
	Step int64  `json:"step"`
}

// muxListener hands gRPC connections to the gRPC server and serves the
// data path itself.
type muxListener struct {
	net.Listener
	a     *Agent
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newMuxListener(l net.Listener, a *Agent) *muxListener {
	m := &muxListener{Listener: l, a: a, conns: make(chan net.Conn), done: make(chan struct{})}
	go m.loop()
	return m
}

func (m *muxListener) loop() {
	for {
		c, err := m.Listener.Accept()
		if err != nil {
			m.Close()
			return
		}
		go m.route(c)
	}
}

// route peeks at a connection's first bytes and sends it on its way.
func (m *muxListener) route(c net.Conn) {
	br := bufio.NewReaderSize(c, 64<<10)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	head, err := br.Peek(4)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		c.Close()
		return
	}
	if [4]byte(head) == dataMagic {
		m.a.serveData(&peekedConn{Conn: c, r: br})
		return
	}
	select {
	case m.conns <- &peekedConn{Conn: c, r: br}:
	case <-m.done:
		c.Close()
	}
}

// Accept returns the next gRPC connection.
func (m *muxListener) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case <-m.done:
		return nil, net.ErrClosed
	}
}

func (m *muxListener) Close() error {
	m.once.Do(func() { close(m.done) })
	return m.Listener.Close()
}

// peekedConn is a connection whose first bytes were read into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (p *peekedConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// serveData answers one data-path request.
func (a *Agent) serveData(c net.Conn) {
	defer c.Close()
	var hdr [8]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	n := binary.BigEndian.Uint32(hdr[4:])
	if n > 4096 {
		return
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		return
	}
	var req dataRequest
	if err := json.Unmarshal(body, &req); err != nil {
		dataError(c, fmt.Errorf("%w: agent: data request: %v", ErrInvalid, err))
		return
	}
	sh, release, err := a.pin(req.Job, req.Rank, req.Step)
	if err != nil {
		dataError(c, err)
		return
	}
	defer release()
	f, err := a.cfg.FS.OpenFile(sh.Path, os.O_RDONLY, 0)
	if err != nil {
		dataError(c, err)
		return
	}
	defer f.Close()
	m, err := shm.Map(f, sh.Size, false)
	if err != nil {
		dataError(c, err)
		return
	}
	defer m.Close()
	var ok [9]byte
	binary.BigEndian.PutUint64(ok[1:], uint64(sh.Size))
	if _, err := c.Write(ok[:]); err != nil {
		return
	}
	if n, err := c.Write(m.Data); err == nil {
		a.metrics.readBytes.Add(float64(n))
	}
}

func dataError(c net.Conn, err error) {
	msg := []byte(err.Error())
	var hdr [5]byte
	hdr[0] = 1
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(msg)))
	_, _ = c.Write(append(hdr[:], msg...))
}

// errDataPath marks a peer that does not speak the data path (or a
// connection that failed before any byte of the shard): gRPC is tried.
var errDataPath = errors.New("peer data path unavailable")

// receiveData reads the shard from the peer's data path straight into dst
// and checks it whole.
func (a *Agent) receiveData(ctx context.Context, ps PeerShard, dst []byte, lim *tiers.Limiter) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", ps.Addr)
	if err != nil {
		return fmt.Errorf("%w: %v", errDataPath, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	body, _ := json.Marshal(dataRequest{Job: ps.Job, Rank: ps.Rank, Step: ps.Step})
	req := append(dataMagic[:], 0, 0, 0, 0)
	binary.BigEndian.PutUint32(req[4:], uint32(len(body)))
	if _, err := c.Write(append(req, body...)); err != nil {
		return fmt.Errorf("%w: %v", errDataPath, err)
	}
	var status [1]byte
	if _, err := io.ReadFull(c, status[:]); err != nil {
		return fmt.Errorf("%w: %v", errDataPath, err)
	}
	if status[0] != 0 {
		var n [4]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return err
		}
		msg := make([]byte, min(binary.BigEndian.Uint32(n[:]), 64<<10))
		_, _ = io.ReadFull(c, msg)
		return fmt.Errorf("%s: %s", ps.Node, msg)
	}
	var size [8]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return err
	}
	if got := int64(binary.BigEndian.Uint64(size[:])); got != int64(len(dst)) {
		return fmt.Errorf("%w: the peer's shard is %d bytes, %d expected", shm.ErrCorrupt, got, len(dst))
	}
	t0 := time.Now()
	const chunk = 8 << 20
	for off := 0; off < len(dst); off += chunk {
		end := min(off+chunk, len(dst))
		if err := lim.Wait(ctx, end-off); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, dst[off:end]); err != nil {
			return fmt.Errorf("after %d of %d bytes: %w", off, len(dst), err)
		}
	}
	t1 := time.Now()
	err = a.checkReceived(ps, dst)
	a.log.Debug("shard received over the peer data path", "bytes", len(dst), "transfer_ms", t1.Sub(t0).Milliseconds(),
		"check_ms", time.Since(t1).Milliseconds())
	return err
}
