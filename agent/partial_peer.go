package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"

	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/transport"
)

// The peer data path's ranged requests (partial.go), beside the whole
// shard's (peerdata.go):
//
//	request:  "RWND" uint32(len) JSON{job, rank, step, header: true}
//	answer:   byte(0) uint64(size), the header's bytes (DataStart of
//	          them), then for each tensor in header order uint32(n) and
//	          its n leaf hashes, little-endian uint64s; or byte(1)
//	          uint32(len) message
//
//	request:  "RWND" uint32(len) JSON{job, rank, step, ranges: [[offset, length], ...]}
//	answer:   byte(0) uint64(total), the ranges' bytes in order; or an error
//	verdict:  the receiver's byte(0) accepted or byte(1) refused
//
// The holder answers the header from a verified copy (the leaf hashes are
// what its verification computed) and the ranges unverified: the receiver
// checks every leaf against its hash, and a refusal has the holder verify
// its copy, as for a whole shard.

// maxRangesPerRequest bounds the ranges of one data request (and so its
// JSON, under maxDataRequest).
const maxRangesPerRequest = 16 << 10

// serveHeader answers a header request.
func (a *Agent) serveHeader(c net.Conn, req dataRequest) {
	sh, release, err := a.pinFor(req.Job, req.Rank, req.Step, false)
	if err == nil && sh.Leaves == nil { // not verified since it was written here: verify it now
		release()
		sh, release, err = a.pin(req.Job, req.Rank, req.Step)
	}
	if err != nil {
		dataError(c, err)
		return
	}
	defer release()
	if sh.Leaves == nil {
		dataError(c, fmt.Errorf("%w: agent: job %s rank %d step %d has no leaf hashes", ErrNotFound, req.Job, req.Rank, req.Step))
		return
	}
	_, raw, err := a.readHeader(sh.Path)
	if err != nil {
		dataError(c, err)
		return
	}
	var b bytes.Buffer
	b.WriteByte(0)
	_ = binary.Write(&b, binary.BigEndian, uint64(sh.Size))
	b.Write(raw)
	for _, hs := range sh.Leaves.hashes {
		_ = binary.Write(&b, binary.LittleEndian, uint32(len(hs)))
		_ = binary.Write(&b, binary.LittleEndian, hs)
	}
	_, _ = c.Write(b.Bytes())
}

// serveRanges answers a ranges request, then waits for the verdict.
func (a *Agent) serveRanges(c net.Conn, req dataRequest) {
	sh, release, err := a.pinFor(req.Job, req.Rank, req.Step, false)
	if err != nil {
		dataError(c, err)
		return
	}
	defer release()
	var total, end int64
	for _, r := range req.Ranges { // in order, apart: at most the shard's bytes, each once
		if len(req.Ranges) > maxRangesPerRequest || r[0] < end || r[1] <= 0 || r[0] > sh.Size-r[1] {
			dataError(c, fmt.Errorf("%w: agent: range of %d bytes at %d of a %d-byte shard (ranges in order, apart, at most %d)",
				ErrInvalid, r[1], r[0], sh.Size, maxRangesPerRequest))
			return
		}
		total, end = total+r[1], r[0]+r[1]
	}
	f, err := a.cfg.FS.OpenFile(sh.Path, os.O_RDONLY, 0)
	if err != nil {
		dataError(c, err)
		return
	}
	defer f.Close()
	var ok [9]byte
	binary.BigEndian.PutUint64(ok[1:], uint64(total))
	if _, err := c.Write(ok[:]); err != nil {
		return
	}
	buf := make([]byte, min(sendBuffer, total))
	for _, r := range req.Ranges {
		for off, end := r[0], r[0]+r[1]; off < end; {
			n := min(int64(len(buf)), end-off)
			if _, err := f.ReadAt(buf[:n], off); err != nil {
				a.log.Warn("reading a segment for a peer's ranged read", "path", sh.Path, "err", err)
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
			a.metrics.readBytes.Add(float64(n))
			off += n
		}
	}
	if err := readVerdict(c); err != nil {
		_, release, verr := a.pin(req.Job, req.Rank, req.Step)
		if verr == nil {
			release()
		}
		a.log.Warn("a peer refused ranges of a shard; this node's copy was verified again", "job", req.Job, "rank", req.Rank,
			"step", req.Step, "err", err, "verify_err", verr)
	}
}

// dialRequest dials ps's peer, sends req and reads the answer up to its
// first byte: the size it announces.
func (a *Agent) dialRequest(ctx context.Context, ps PeerShard, req dataRequest) (net.Conn, int64, error) {
	conn, err := a.cfg.Transport.DialData(ctx, ps.Addr, transport.ExpectNode(ps.Node))
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %v", errDataPath, err)
	}
	c := stallConn{conn}
	n, err := sendDataRequest(c, req, ps.Node)
	if err != nil {
		conn.Close()
		return nil, 0, err
	}
	return conn, n, nil
}

// fetchHeader asks ps's peer for the shard's header and leaf hashes, and
// checks them: the header against ps.HeaderSum and what it must name, the
// hashes against each tensor's checksum. raw is the header's bytes.
func (a *Agent) fetchHeader(ctx context.Context, ps PeerShard) (raw []byte, _ *shm.Header, _ [][]uint64, _ error) {
	conn, size, err := a.dialRequest(ctx, ps, dataRequest{Job: ps.Job, Rank: ps.Rank, Step: ps.Step, Header: true})
	if err != nil {
		return nil, nil, nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	r := stallConn{conn}
	if size != ps.Size {
		return nil, nil, nil, fmt.Errorf("%w: the peer's shard is %d bytes, %d expected", shm.ErrCorrupt, size, ps.Size)
	}
	var lenb [8]byte
	if _, err := io.ReadFull(r, lenb[:]); err != nil {
		return nil, nil, nil, err
	}
	n, err := headerLen(lenb, size)
	if err != nil {
		return nil, nil, nil, err
	}
	raw = make([]byte, 8+n) // the header only: the shard's bytes stay where they are
	copy(raw, lenb[:])
	if _, err := io.ReadFull(r, raw[8:]); err != nil {
		return nil, nil, nil, err
	}
	h, err := shm.Decode(bytes.NewReader(raw), size) // the tensors against the whole shard's size
	if err != nil {
		return nil, nil, nil, err
	}
	if err := isShardAsked(h, raw, ps); err != nil {
		return nil, nil, nil, err
	}
	leaves := make([][]uint64, len(h.Tensors))
	for i, t := range h.Tensors {
		var n uint32
		if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
			return nil, nil, nil, err
		}
		if want := shm.NumLeaves(t.Len()); int(n) != want || !t.HasSum {
			return nil, nil, nil, fmt.Errorf("%w: tensor %q: %d leaf hashes for %d bytes (checksum in the header: %t)", shm.ErrCorrupt, t.Name, n, t.Len(), t.HasSum)
		}
		leaves[i] = make([]uint64, n)
		if err := binary.Read(r, binary.LittleEndian, leaves[i]); err != nil {
			return nil, nil, nil, err
		}
		if shm.RootOf(leaves[i]) != t.Sum {
			return nil, nil, nil, fmt.Errorf("%w: tensor %q: the peer's leaf hashes do not make its checksum", shm.ErrCorrupt, t.Name)
		}
	}
	return raw, h, leaves, nil
}

// fetchRuns fetches runs of leaves of p from src into p's file, checking
// each leaf against its hash before it is written. A leaf that does not
// match is not written, the rest are, and the holder is told (refused):
// the error wraps shm.ErrCorrupt. It returns the bytes written.
func (a *Agent) fetchRuns(ctx context.Context, p *partial, src Source, runs []leafRun) (int64, error) {
	if st := a.rangedStore(src); st != nil {
		return a.fetchTierRuns(ctx, p, src, st, runs)
	}
	var written int64
	for len(runs) > 0 {
		batch := runs[:min(len(runs), maxRangesPerRequest)]
		runs = runs[len(batch):]
		n, err := a.fetchBatch(ctx, p, src, batch)
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

func (a *Agent) fetchBatch(ctx context.Context, p *partial, src Source, runs []leafRun) (int64, error) {
	ps := p.ps
	ps.Node, ps.Addr = src.Node, src.Addr
	req := dataRequest{Job: ps.Job, Rank: ps.Rank, Step: ps.Step, Ranges: make([][2]int64, len(runs))}
	var total int64
	for i, r := range runs {
		req.Ranges[i] = [2]int64{r.lo, r.hi - r.lo}
		total += r.hi - r.lo
	}
	conn, n, err := a.dialRequest(ctx, ps, req)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	c := stallConn{conn}
	if n != total {
		return 0, fmt.Errorf("%w: the peer announced %d bytes for %d asked", errDataPath, n, total)
	}
	buf := make([]byte, shm.LeafSize)
	var written, read int64
	var bad error
	for _, r := range runs {
		for j := r.first; j <= r.last; j++ {
			lo := r.lo + int64(j-r.first)*shm.LeafSize
			b := buf[:min(shm.LeafSize, r.hi-lo)]
			if _, err := io.ReadFull(c, b); err != nil {
				return written, fmt.Errorf("after %d of %d bytes: %w", read, total, err)
			}
			read += int64(len(b))
			if !shm.LeafMatches(b, p.leaves[r.t][j]) {
				if bad == nil {
					bad = fmt.Errorf("%w: tensor %q leaf %d from %s does not match its hash", shm.ErrCorrupt, p.h.Tensors[r.t].Name, j, src.Node)
				}
				continue
			}
			if _, err := p.f.WriteAt(b, lo); err != nil {
				return written, fmt.Errorf("agent: writing a partially open shard: %w", err)
			}
			p.have[r.t][j] = true
			written += int64(len(b))
		}
	}
	verdict := byte(verdictAccepted)
	if bad != nil {
		verdict = verdictRefused
	}
	_, _ = c.Write([]byte{verdict})
	return written, bad
}
