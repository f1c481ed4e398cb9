package agent

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// Ranged reads from a durable tier. Where no peer holds a shard in memory
// but a tier this node reads does (the parallel filesystem, the object
// store, this node's own NVMe), a ranged Open reads the shard's header
// from the tier copy and its leaf hashes from the object beside it
// (tiers.LeavesName, written when the shard was pushed), checks both as
// a peer's are checked, and Fill reads only the leaves the ranges touch,
// in ranged reads of up to tierReadLeaves leaves, tierReadWorkers at a
// time. All copies of a shard with one header checksum hold the same
// bytes, so a partial open made from a peer's header also fills from a
// tier when its peers fail, and the other way round.

// tierReadLeaves is how many leaves one ranged read of a tier asks for.
const tierReadLeaves = 8

// rangedStore returns the store that serves src's ranged reads, or nil
// when src is no tier this node reads in ranges (a peer's memory, another
// node's NVMe, a store that reads whole objects only).
func (a *Agent) rangedStore(src Source) tiers.Store {
	n := tiers.Name(src.Tier)
	if !n.Valid() || n.NodeLocal() && src.Node != a.cfg.Node {
		return nil
	}
	st := a.cfg.Stores[n]
	if _, ok := st.(tiers.RangeReader); !ok {
		return nil
	}
	return st
}

// rangedSources returns the sources a partial open can read from, in the
// order given (the coordinator's, cheapest first): peers' memory and the
// tiers this node reads in ranges.
func (a *Agent) rangedSources(srcs []Source) []Source {
	var out []Source
	for _, s := range srcs {
		if dials(s, a.cfg.Node) || a.rangedStore(s) != nil {
			out = append(out, s)
		}
	}
	return out
}

// headerFrom reads ps's header and leaf hashes from src, checked.
func (a *Agent) headerFrom(ctx context.Context, ps PeerShard, src Source) ([]byte, *shm.Header, [][]uint64, error) {
	if st := a.rangedStore(src); st != nil {
		return a.tierHeader(ctx, ps, st)
	}
	from := ps
	from.Node, from.Addr = src.Node, src.Addr
	return a.fetchHeader(ctx, from)
}

// tierHeader reads ps's header from its copy on st and the leaf hashes
// beside it, and checks them: the header against ps.HeaderSum, the hashes
// against the header's checksums. A copy pushed without its hashes is an
// error for which tiers.IsNotExist is true.
func (a *Agent) tierHeader(ctx context.Context, ps PeerShard, st tiers.Store) (raw []byte, _ *shm.Header, _ [][]uint64, _ error) {
	name := tiers.ShardName(ps.Job, ps.Step, ps.Rank)
	var lenb [8]byte
	if err := tiers.ReadRange(ctx, st, name, 0, lenb[:]); err != nil {
		return nil, nil, nil, err
	}
	n, err := headerLen(lenb, ps.Size)
	if err != nil {
		return nil, nil, nil, err
	}
	raw = make([]byte, 8+n)
	copy(raw, lenb[:])
	if err := tiers.ReadRange(ctx, st, name, 8, raw[8:]); err != nil {
		return nil, nil, nil, err
	}
	h, err := shm.Decode(bytes.NewReader(raw), ps.Size)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := isShardAsked(h, raw, ps); err != nil {
		return nil, nil, nil, err
	}
	leaves, err := tiers.GetLeaves(ctx, st, ps.Job, ps.Step, ps.Rank, h)
	if tiers.IsNotExist(err) {
		return nil, nil, nil, fmt.Errorf("no leaf hashes beside the copy on %s (pushed without them): %w", st, err)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	return raw, h, leaves, nil
}

// headerLen checks the length a shard's first 8 bytes give its header.
func headerLen(lenb [8]byte, size int64) (uint64, error) {
	n := binary.LittleEndian.Uint64(lenb[:])
	if n < 2 || n > shm.MaxHeaderBytes || n > uint64(size-8) {
		return 0, fmt.Errorf("%w: header length %d for a %d-byte shard", shm.ErrCorrupt, n, size)
	}
	return n, nil
}

// tierReadWorkers is how many ranged reads of one Fill are in flight at
// once: an object store serves each at a connection's rate.
const tierReadWorkers = 4

// tierChunk is leaves first.. of tensor t, bytes [lo, hi) of the shard:
// one ranged read.
type tierChunk struct {
	t, first int
	lo, hi   int64
}

// fetchTierRuns reads runs of leaves of p from its copy on st into p's
// file, tierReadWorkers ranged reads at a time, checking each leaf against
// its hash before it is written, as fetchBatch does for a peer's. A leaf
// that does not match is not written (the error wraps shm.ErrCorrupt). It
// returns the bytes written.
func (a *Agent) fetchTierRuns(ctx context.Context, p *partial, src Source, st tiers.Store, runs []leafRun) (int64, error) {
	var chunks []tierChunk
	var largest int64
	for _, r := range runs {
		for j := r.first; j <= r.last; j += tierReadLeaves {
			lo := r.lo + int64(j-r.first)*shm.LeafSize
			c := tierChunk{t: r.t, first: j, lo: lo, hi: min(lo+tierReadLeaves*shm.LeafSize, r.hi)}
			chunks, largest = append(chunks, c), max(largest, c.hi-c.lo)
		}
	}
	name := tiers.ShardName(p.ps.Job, p.ps.Step, p.ps.Rank)
	var (
		next   atomic.Int64
		mu     sync.Mutex
		done   [][2]int // (tensor, leaf) written and checked
		bad    error    // the first leaf that did not match
		failed error    // the first read or write that failed
	)
	var wg sync.WaitGroup
	for range min(tierReadWorkers, len(chunks)) {
		wg.Go(func() {
			buf := make([]byte, largest)
			for i := next.Add(1) - 1; i < int64(len(chunks)) && ctx.Err() == nil; i = next.Add(1) - 1 {
				c := chunks[i]
				ok, mismatch, err := a.readTierChunk(ctx, p, st, name, c, buf[:c.hi-c.lo])
				mu.Lock()
				for _, j := range ok {
					done = append(done, [2]int{c.t, j})
				}
				bad = cmp.Or(bad, mismatch)
				failed = cmp.Or(failed, err)
				mu.Unlock()
				if err != nil {
					next.Store(int64(len(chunks))) // the others stop too
					return
				}
			}
		})
	}
	wg.Wait()
	var written int64
	for _, d := range done {
		p.have[d[0]][d[1]] = true
		written += min(shm.LeafSize, p.h.Tensors[d[0]].Len()-int64(d[1])*shm.LeafSize)
	}
	if failed == nil {
		failed = context.Cause(ctx)
	}
	if failed != nil {
		return written, fmt.Errorf("%s: %w", src.Tier, failed)
	}
	if bad != nil {
		a.log.Warn("a tier copy's leaf does not match its hash; reading it elsewhere", "job", p.ps.Job, "rank", p.ps.Rank, "step", p.ps.Step, "tier", src.Tier, "err", bad)
		a.suspectTier(p.ps, src, bad)
	}
	return written, bad
}

// readTierChunk reads chunk c of p's shard from st into b and writes each
// of its leaves that matches its hash into p's file. It returns the leaves
// written, the first that did not match, and a read or write error.
func (a *Agent) readTierChunk(ctx context.Context, p *partial, st tiers.Store, name string, c tierChunk, b []byte) (ok []int, bad, _ error) {
	if err := tiers.ReadRange(ctx, st, name, c.lo, b); err != nil {
		return nil, nil, err
	}
	for k := 0; int64(k)*shm.LeafSize < int64(len(b)); k++ {
		leaf := b[int64(k)*shm.LeafSize : min(int64(k+1)*shm.LeafSize, int64(len(b)))]
		if !shm.LeafMatches(leaf, p.leaves[c.t][c.first+k]) {
			bad = cmp.Or(bad, fmt.Errorf("%w: tensor %q leaf %d from %s does not match its hash", shm.ErrCorrupt, p.h.Tensors[c.t].Name, c.first+k, st))
			continue
		}
		if _, err := p.f.WriteAt(leaf, c.lo+int64(k)*shm.LeafSize); err != nil {
			return ok, bad, fmt.Errorf("agent: writing a partially open shard: %w", err)
		}
		ok = append(ok, c.first+k)
	}
	return ok, bad, nil
}

// servedBy names a source in a Fill's answer: the node for a peer's
// memory, the tier for a tier copy.
func servedBy(src Source) string {
	if src.Tier == "shm" {
		return src.Node
	}
	return src.Tier
}
