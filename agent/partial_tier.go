package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// Ranged reads from a durable tier. Where no peer holds a shard in memory
// but a tier this node reads does (the parallel filesystem, the object
// store, this node's own NVMe), a ranged Open reads the shard's header
// from the tier copy and its leaf hashes from the object beside it
// (tiers.LeavesName, written when the shard was pushed), checks both as
// a peer's are checked, and Fill reads only the leaves the ranges touch,
// a ranged read of up to tierReadLeaves leaves at a time. All copies of a
// shard with one header checksum hold the same bytes, so a partial open
// made from a peer's header also fills from a tier when its peers fail,
// and the other way round.

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

// fetchTierRuns reads runs of leaves of p from its copy on st into p's
// file, checking each leaf against its hash before it is written, as
// fetchBatch does for a peer's. It returns the bytes written.
func (a *Agent) fetchTierRuns(ctx context.Context, p *partial, src Source, st tiers.Store, runs []leafRun) (int64, error) {
	name := tiers.ShardName(p.ps.Job, p.ps.Step, p.ps.Rank)
	buf := make([]byte, tierReadLeaves*shm.LeafSize)
	var written int64
	var bad error
	for _, r := range runs {
		for j := r.first; j <= r.last; j += tierReadLeaves {
			lo := r.lo + int64(j-r.first)*shm.LeafSize
			b := buf[:min(int64(len(buf)), r.hi-lo)]
			if err := tiers.ReadRange(ctx, st, name, lo, b); err != nil {
				return written, fmt.Errorf("%s: %w", src.Tier, err)
			}
			for k := 0; int64(k)*shm.LeafSize < int64(len(b)); k++ {
				leaf := b[int64(k)*shm.LeafSize : min(int64(k+1)*shm.LeafSize, int64(len(b)))]
				if !shm.LeafMatches(leaf, p.leaves[r.t][j+k]) {
					if bad == nil {
						bad = fmt.Errorf("%w: tensor %q leaf %d from %s does not match its hash", shm.ErrCorrupt, p.h.Tensors[r.t].Name, j+k, st)
					}
					continue
				}
				if _, err := p.f.WriteAt(leaf, lo+int64(k)*shm.LeafSize); err != nil {
					return written, fmt.Errorf("agent: writing a partially open shard: %w", err)
				}
				p.have[r.t][j+k] = true
				written += int64(len(leaf))
			}
		}
	}
	if bad != nil {
		a.log.Warn("a tier copy's leaf does not match its hash; reading it elsewhere", "job", p.ps.Job, "rank", p.ps.Rank, "step", p.ps.Step, "tier", src.Tier, "err", bad)
	}
	return written, bad
}

// servedBy names a source in a Fill's answer: the node for a peer's
// memory, the tier for a tier copy.
func servedBy(src Source) string {
	if src.Tier == "shm" {
		return src.Node
	}
	return src.Tier
}
