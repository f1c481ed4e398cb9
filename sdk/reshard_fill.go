package sdk

import (
	"context"
	"fmt"
	"sync"

	"rewind.dev/rewind/api/agentpb"
)

// A shard the node lacks is opened partially (OpenResponse.partial): its
// header is mapped at once, its tensors' bytes are read only once the
// agent has fetched them (Fill). Before copying, RestoreInto asks, for
// every partial shard in one call, for the byte ranges of the first copy
// of each box its slices overlap; a copy tried after another failed is
// fetched when it is tried. What Fill fetched is checked by the agent
// leaf by leaf and again here, as every byte a slice reads.

// prefill fetches, for each partial shard, the ranges the first copy of
// each box the slices need lies in, a call per shard, the shards at once.
// A shard whose fill failed keeps the error: its pieces are then fetched
// one by one as they are read (ready).
func (s *Session) prefill(ctx context.Context, shards []*openShard, byName map[string][]*piece, want []Slice, res *Resharded) error {
	ranges := make([][]*agentpb.ByteRange, len(shards))
	for i := range want {
		sl := &want[i]
		pieces := byName[sl.Name]
		if len(pieces) == 0 {
			continue // fill says so
		}
		groups, err := cover(sl, pieces)
		if err != nil {
			return err
		}
		for _, copies := range groups {
			p := copies[0]
			if o := shards[p.rank]; o.partial {
				ranges[p.rank] = append(ranges[p.rank], o.rangeOf(p, sl))
			}
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for r, rs := range ranges {
		if len(rs) == 0 {
			continue
		}
		wg.Go(func() {
			n, err := s.fillShard(ctx, shards[r], rs)
			mu.Lock()
			defer mu.Unlock()
			res.Fetched += n
			shards[r].fillErr = err
		})
	}
	wg.Wait()
	return nil
}

// rangeOf is the bytes of o's shard that piece p's overlap with sl lies in.
func (o *openShard) rangeOf(p *piece, sl *Slice) *agentpb.ByteRange {
	lo, n, _ := intersect(p.offs, p.t.Shape, sl.Offsets, sl.Lengths)
	blo, bhi := p.byteRange(lo, n, sl.DType.Size())
	base := o.h.DataStart + p.t.Begin
	return &agentpb.ByteRange{Offset: uint64(base + blo), Length: uint64(bhi - blo)}
}

// fillShard has the agent fetch ranges of a partial shard, in as few
// calls as the agent takes (fillCalls). It is bounded by the caller's
// context, not the call timeout: it moves bytes.
func (s *Session) fillShard(ctx context.Context, o *openShard, ranges []*agentpb.ByteRange) (int64, error) {
	var fetched int64
	for _, call := range fillCalls(ranges) {
		resp, err := s.c.api.Fill(ctx, &agentpb.FillRequest{Lease: o.lease, Ranges: call})
		if err != nil {
			return fetched, wrap(fmt.Sprintf("fetching %d ranges of rank %d's shard", len(call), o.sh.Rank), err)
		}
		fetched += int64(resp.FetchedBytes)
	}
	return fetched, nil
}

// fillCalls merges ranges that touch or overlap (the whole tensors of a
// shard lie one after another: one range), in offset order, and splits
// them into calls of at most agentpb.MaxFillRanges. A shard of 100,000
// tensors and more was otherwise refused whole, then fetched a call per
// piece.
func fillCalls(ranges []*agentpb.ByteRange) [][]*agentpb.ByteRange {
	rs := make([][2]int64, len(ranges))
	for i, r := range ranges {
		rs[i] = [2]int64{int64(r.Offset), int64(r.Length)}
	}
	var calls [][]*agentpb.ByteRange
	for merged := agentpb.MergedRanges(rs); len(merged) > 0; {
		n := min(len(merged), agentpb.MaxFillRanges)
		call := make([]*agentpb.ByteRange, n)
		for i, r := range merged[:n] {
			call[i] = &agentpb.ByteRange{Offset: uint64(r[0]), Length: uint64(r[1])}
		}
		calls, merged = append(calls, call), merged[n:]
	}
	return calls
}

// ready makes the bytes of copy p (the i-th copy of its box) that overlap
// sl readable: a partial shard's first copy was fetched by prefill; a
// later one is fetched now, and so is the first where the shard's prefill
// failed (the agent fetches only the leaves it lacks: those of the other
// pieces are there, a corrupt one is not).
func (s *Session) ready(ctx context.Context, shards []*openShard, p *piece, i int, sl *Slice, res *Resharded) error {
	o := shards[p.rank]
	if !o.partial || (i == 0 && o.fillErr == nil) {
		return nil
	}
	n, err := s.fillShard(ctx, o, []*agentpb.ByteRange{o.rangeOf(p, sl)})
	res.Fetched += n
	return err
}
