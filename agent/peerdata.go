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

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
	"rewind.dev/rewind/transport"
)

// The peer data path. A shard copied between agents (a replica, a restore
// from a peer's memory) is the bulk of recovery's data movement; over gRPC
// it is split into 1 MiB messages, copied several times and framed in
// 16 KiB HTTP/2 frames, which reaches about a third of what the loopback
// link carries. So the agent's TCP port also speaks a plain protocol,
// told apart from gRPC by its first four bytes:
//
//	request:  "RWND" uint32(len) JSON{job, rank, step}
//	answer:   byte(0) uint64(size) followed by the shard's bytes; or
//	          byte(1) uint32(len) message
//	verdict:  the receiver's byte(0) accepted or byte(1) refused, after
//	          the whole shard
//
// The receiver reads straight into its own mapped segment, hashes every
// leaf of the checksum trees as it lands, and commits only when every
// checksum matches. So the holder pins the shard without verifying it
// first (a gRPC Read does); it verifies only a shard the receiver refused.

var dataMagic = [4]byte{'R', 'W', 'N', 'D'}

type dataRequest struct {
	Job  string `json:"job"`
	Rank uint32 `json:"rank"`
	Step int64  `json:"step"`
	// Header asks for the header and leaf hashes only, Ranges for byte
	// ranges (offset, length) only (partial_peer.go).
	Header bool       `json:"header,omitempty"`
	Ranges [][2]int64 `json:"ranges,omitempty"`
}

// maxDataRequest bounds a data request's JSON.
const maxDataRequest = 1 << 20

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

// NetConn is the connection under p (transport.PeerOf looks through it).
func (p *peekedConn) NetConn() net.Conn { return p.Conn }

// The receiver's verdict, one byte after the whole shard: accepted, or
// refused because a checksum did not match. A receiver that predates
// verdicts closes the connection instead.
const (
	verdictAccepted = 0
	verdictRefused  = 1
)

// serveData answers one data-path request. The shard goes out unverified:
// the receiver checks every byte against the header as it arrives and
// commits or restores nothing unless all of them match (receiveData), so a
// check here would only read the whole shard once more before its first
// byte moves. A refusal, or a copy that broke off, has the shard verified
// here afterwards (pin): a copy rotten in this node's memory is then found
// and marked corrupt where it lies, as a verified read would have.
func (a *Agent) serveData(conn net.Conn) {
	defer conn.Close()
	c := stallConn{conn}
	if err := a.authz.Allow(transport.PeerOf(conn), transport.DataPath, nil); err != nil {
		dataError(c, err)
		return
	}
	req, err := readDataRequest(c)
	if err != nil {
		if errors.Is(err, ErrInvalid) {
			dataError(c, err)
		}
		return
	}
	switch {
	case req.Header:
		a.serveHeader(c, req)
		return
	case len(req.Ranges) > 0:
		a.serveRanges(c, req)
		return
	}
	sh, release, err := a.pinFor(req.Job, req.Rank, req.Step, false)
	if err != nil {
		dataError(c, err)
		return
	}
	defer release()
	started, err := a.sendShard(c, sh)
	if err == nil {
		err = readVerdict(c)
	}
	if started && err != nil { // whose fault? pin verifies, and marks a corrupt copy so
		_, release, verr := a.pin(req.Job, req.Rank, req.Step)
		if verr == nil {
			release()
		}
		a.log.Warn("a peer copy was refused or broke off; this node's copy was verified again", "job", req.Job, "rank", req.Rank,
			"step", req.Step, "err", err, "verify_err", verr)
	}
}

func readDataRequest(c net.Conn) (dataRequest, error) {
	var req dataRequest
	var hdr [8]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return req, err
	}
	n := binary.BigEndian.Uint32(hdr[4:])
	if n > maxDataRequest {
		return req, fmt.Errorf("agent: data request of %d bytes", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		return req, err
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return req, fmt.Errorf("%w: agent: data request: %v", ErrInvalid, err)
	}
	return req, nil
}

// sendBuffer is what the holder reads from the segment file before it
// writes it to the connection.
const sendBuffer = 4 << 20

// sendShard writes the answer and the shard's bytes; started says whether
// any of the shard went out. The bytes are read from the segment file into
// a buffer that stays in cache and written from there: with shared memory
// in 4 KiB pages that is faster than writing from a mapping of the segment
// (no page table of a million entries to fill, no TLB misses), although it
// copies the bytes once more.
func (a *Agent) sendShard(c net.Conn, sh *shardInfo) (started bool, err error) {
	f, err := a.cfg.FS.OpenFile(sh.Path, os.O_RDONLY, 0)
	if err != nil {
		dataError(c, err)
		return false, err
	}
	defer f.Close()
	var ok [9]byte
	binary.BigEndian.PutUint64(ok[1:], uint64(sh.Size))
	if _, err := c.Write(ok[:]); err != nil {
		return false, err
	}
	buf := make([]byte, min(sendBuffer, sh.Size))
	for off := int64(0); off < sh.Size; {
		n := min(int64(len(buf)), sh.Size-off)
		if _, err := f.ReadAt(buf[:n], off); err != nil {
			return true, fmt.Errorf("agent: reading %s: %w", sh.Path, err)
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return true, err
		}
		a.metrics.readBytes.Add(float64(n))
		off += n
	}
	return true, nil
}

// readVerdict waits for the receiver's verdict on the shard just sent: nil
// when it accepted it, or closed without a verdict (an older receiver).
func readVerdict(c net.Conn) error {
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	var v [1]byte
	if _, err := io.ReadFull(c, v[:]); errors.Is(err, io.EOF) {
		return nil
	} else if err != nil {
		return fmt.Errorf("agent: no verdict from the receiver: %w", err)
	}
	if v[0] != verdictAccepted {
		return fmt.Errorf("%w: the receiver refused the shard", shm.ErrCorrupt)
	}
	return nil
}

func dataError(c net.Conn, err error) {
	msg := []byte(err.Error())
	var hdr [5]byte
	hdr[0] = 1
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(msg)))
	_, _ = c.Write(append(hdr[:], msg...))
}

// peerStall bounds how long one read or write of the data path may make
// no progress. A peer that stops (a paused or partitioned node: its kernel
// still holds the connection open) must not hold the copy, and the rank's
// copy lock with it, until the caller's deadline: a restore of that rank
// waits for that lock. Failure detection declares such a node dead within
// a few seconds; this is well beyond that, and far beyond any pause of a
// healthy peer.
var peerStall = 10 * time.Second

// stallConn is a connection whose every read and write fails after
// peerStall without progress (net.Conn deadlines, renewed per call).
type stallConn struct{ net.Conn }

func (c stallConn) Read(p []byte) (int, error) {
	_ = c.Conn.SetReadDeadline(time.Now().Add(peerStall))
	return c.Conn.Read(p)
}

func (c stallConn) Write(p []byte) (int, error) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(peerStall))
	return c.Conn.Write(p)
}

// errDataPath marks a peer that does not speak the data path (or a
// connection that failed before any byte of the shard): gRPC is tried.
var errDataPath = errors.New("peer data path unavailable")

// dataChunk is what the receiver reads before it hashes the leaves that
// arrived (still in cache: the last level holds several chunks) and waits
// on the bandwidth limit again.
const dataChunk = 8 << 20

// receiveData reads the shard from the peer's data path straight into dst,
// checking it as it arrives (receiveShard), and answers with its verdict.
func (a *Agent) receiveData(ctx context.Context, ps PeerShard, dst []byte, lim *tiers.Limiter) error {
	conn, err := a.cfg.Transport.DialData(ctx, ps.Addr, transport.ExpectNode(ps.Node))
	if err != nil {
		return fmt.Errorf("%w: %v", errDataPath, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	c := stallConn{conn}
	if err := requestShard(c, ps, int64(len(dst))); err != nil {
		return err
	}
	t0 := time.Now()
	err = a.receiveShard(ctx, c, ps, dst, lim)
	switch {
	case err == nil:
		_, _ = c.Write([]byte{verdictAccepted})
	case errors.Is(err, shm.ErrCorrupt):
		_, _ = c.Write([]byte{verdictRefused})
	}
	a.log.Debug("shard received over the peer data path", "bytes", len(dst), "receive_and_check_ms", time.Since(t0).Milliseconds(), "err", err)
	return err
}

// requestShard asks for the shard and reads the answer up to its first
// byte: size bytes must follow.
func requestShard(c net.Conn, ps PeerShard, size int64) error {
	n, err := sendDataRequest(c, dataRequest{Job: ps.Job, Rank: ps.Rank, Step: ps.Step}, ps.Node)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%w: the peer's shard is %d bytes, %d expected", shm.ErrCorrupt, n, size)
	}
	return nil
}

// sendDataRequest sends req to node and reads the answer up to the size
// it announces; an error answer is returned as an error naming node.
func sendDataRequest(c net.Conn, req dataRequest, node string) (int64, error) {
	body, _ := json.Marshal(req)
	msg := append(dataMagic[:], 0, 0, 0, 0)
	binary.BigEndian.PutUint32(msg[4:], uint32(len(body)))
	if _, err := c.Write(append(msg, body...)); err != nil {
		return 0, fmt.Errorf("%w: %v", errDataPath, err)
	}
	var status [1]byte
	if _, err := io.ReadFull(c, status[:]); err != nil {
		return 0, fmt.Errorf("%w: %v", errDataPath, err)
	}
	if status[0] != 0 {
		var n [4]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return 0, err
		}
		text := make([]byte, min(binary.BigEndian.Uint32(n[:]), 64<<10))
		_, _ = io.ReadFull(c, text)
		return 0, fmt.Errorf("%s: %s", node, text)
	}
	var got [8]byte
	if _, err := io.ReadFull(c, got[:]); err != nil {
		return 0, err
	}
	return int64(binary.BigEndian.Uint64(got[:])), nil
}

// receiveShard reads a shard from r into dst and checks it in the same
// pass: first the header (the shard asked for, the header checksum the
// caller names), then each leaf of every tensor's checksum tree as soon as
// it is in place, while it is still in cache. It returns nil only when
// every tensor's checksum matches the header, the same guarantee as a
// verification after the copy, without a second pass over the shard.
func (a *Agent) receiveShard(ctx context.Context, r io.Reader, ps PeerShard, dst []byte, lim *tiers.Limiter) error {
	h, err := receiveHeader(r, ps, dst)
	if err != nil {
		return err
	}
	check := h.NewStreamCheck(dst)
	check.Arrived(h.DataStart)
	size := int64(len(dst))
	if h.DataStart == size { // no tensor bytes: nothing can be damaged in flight
		if err := a.faultReceived(ctx, ps, h, dst); err != nil {
			return err
		}
	}
	for off := h.DataStart; off < size; {
		end := min(off+dataChunk, size)
		if err := lim.Wait(ctx, int(end-off)); err != nil {
			return err
		}
		if _, err := io.ReadFull(r, dst[off:end]); err != nil {
			return fmt.Errorf("after %d of %d bytes: %w", off, size, err)
		}
		if off == h.DataStart {
			if err := a.faultReceived(ctx, ps, h, dst[:end]); err != nil {
				return err
			}
		}
		check.Arrived(end)
		off = end
	}
	return check.Check()
}

// receiveHeader reads a shard's header into the start of dst and checks
// that it is the shard asked for, with the header checksum asked for.
func receiveHeader(r io.Reader, ps PeerShard, dst []byte) (*shm.Header, error) {
	if len(dst) < 8 {
		return nil, fmt.Errorf("%w: a %d-byte shard", shm.ErrCorrupt, len(dst))
	}
	if _, err := io.ReadFull(r, dst[:8]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(dst[:8])
	if n > shm.MaxHeaderBytes || n > uint64(len(dst)-8) {
		return nil, fmt.Errorf("%w: header length %d for a %d-byte shard", shm.ErrCorrupt, n, len(dst))
	}
	if _, err := io.ReadFull(r, dst[8:8+n]); err != nil {
		return nil, err
	}
	h, err := shm.DecodeBytes(dst) // reads the header's bytes only
	if err != nil {
		return nil, err
	}
	if err := isShardAsked(h, dst[:h.DataStart], ps); err != nil {
		return nil, err
	}
	return h, nil
}

// isShardAsked checks a received header (raw: its bytes) against the
// shard asked for: its checksum, and the job, rank and step it names.
func isShardAsked(h *shm.Header, raw []byte, ps PeerShard) error {
	if sum := shm.HeaderSum(raw); sum != ps.HeaderSum {
		return fmt.Errorf("%w: header checksum %s, expected %s", shm.ErrCorrupt, sum, ps.HeaderSum)
	}
	if !h.Rewind || h.Meta.Job != ps.Job || h.Meta.Rank != ps.Rank || h.Meta.Step != ps.Step {
		return fmt.Errorf("%w: received %s rank %d step %d", shm.ErrCorrupt, h.Meta.Job, h.Meta.Rank, h.Meta.Step)
	}
	return nil
}

// faultReceived is the fault point agent/replica-received: the first of a
// shard's bytes arrived from a peer (b is the shard up to where it has)
// and are not yet checked. A corrupt fault flips a bit of the first
// tensor's bytes that arrived, before their leaf is hashed.
func (a *Agent) faultReceived(ctx context.Context, ps PeerShard, h *shm.Header, b []byte) error {
	f := a.cfg.Faults.Eval(ctx, faultinject.AgentReplicaReceived)
	if f.Kind != faultinject.KindCorrupt {
		return f.Err()
	}
	for _, t := range h.Tensors {
		if lo := h.DataStart + t.Begin; t.End > t.Begin && lo < int64(len(b)) {
			off := lo + int64(faultinject.Flip(b[lo:min(h.DataStart+t.End, int64(len(b)))], f))
			a.log.Warn("fault: flipped a bit of a shard arriving from a peer", "node", ps.Node, "offset", off)
			break
		}
	}
	return nil
}
