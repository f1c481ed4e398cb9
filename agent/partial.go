package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/vfs"
)

// Ranged reads across nodes. A rank restoring at another world size needs
// only the parts of other ranks' shards that overlap its new slices; where
// its node lacks a shard, pulling it whole moves every byte of it. So a
// ranged Open (OpenRequest.ranged) of a shard a peer holds in memory opens
// it partially: the agent asks the peer for the shard's header and its
// tensors' leaf hashes (the peer verifies its copy first, which is what
// makes the hashes), checks the header against the checksum the
// coordinator recorded at commit and the hashes against the header's
// checksums, and writes the header into a sparse file of the shard's size
// under <root>/.partial. The caller maps that file (its descriptor from
// the segment socket, as for any lease), works out the byte ranges it
// needs from the header, and asks Fill for them: the agent fetches the
// 1 MiB leaves the ranges touch from the peer's data path, checks each
// against its hash before writing it, and answers once they are in place.
// Unwritten pages of a tmpfs file take no memory: the budget is charged
// with the header and the leaves fetched, and freed with the lease.
//
// A tier copy serves ranged reads too (partial_tier.go). Where no source
// answers with the header and leaf hashes (only a tier copy pushed without
// its hashes holds the shard, say), the Open pulls the shard whole, as
// without ranged.

// partialName is the directory under the shared-memory root that holds
// partially open shards, one file per lease; emptied at start.
const partialName = ".partial"

// partial is a shard of another node's memory, open for ranged reads.
type partial struct {
	ps      PeerShard
	path    string
	h       *shm.Header
	leaves  [][]uint64 // each tensor's leaf hashes, in header order, checked against its checksum
	sources []Source   // peers holding the shard in memory and tiers read in ranges, cheapest first
	expires time.Time  // guarded by the agent's mu

	mu      sync.Mutex // serializes Fills
	f       vfs.File
	have    [][]bool // have[i][j]: leaf j of tensor i is written and checked
	charged int64    // budget charged: the header and the leaves fetched
	next    int      // the source to try first
}

// partialDir is where partially open shards live.
func (a *Agent) partialDir() string { return filepath.Join(a.cfg.ShmRoot, partialName) }

// clearPartials removes what a previous run left partially open.
func (a *Agent) clearPartials() error {
	return a.cfg.FS.RemoveAll(a.partialDir())
}

// openRanged is Open for a caller that reads parts of the shard: where
// the node lacks it and peers hold it in memory, it is opened partially
// (partial is true, the lease a partial one).
func (a *Agent) openRanged(ctx context.Context, job string, rank uint32, step int64) (_ *shardInfo, _ *tensorLeaves, lease uint64, isPartial bool, _ error) {
	sh, lease, err := a.Open(job, rank, step, false)
	if err == nil || a.rep == nil || !errors.Is(err, ErrNotFound) {
		if sh != nil {
			return sh, sh.Leaves, lease, false, err
		}
		return nil, nil, 0, false, err
	}
	a.expirePartials()
	src, rerr := a.rep.c.RankSources(ctx, &coordpb.RankSourcesRequest{Job: job, Step: step, Rank: rank, Node: a.cfg.Node})
	if rerr != nil {
		return nil, nil, 0, false, fmt.Errorf("%w (and asking the coordinator where it is: %v)", err, rerr)
	}
	ps := PeerShard{Job: job, Rank: rank, WorldSize: src.WorldSize, Step: step, Size: int64(src.SizeBytes), HeaderSum: src.HeaderChecksum}
	var all []Source
	for _, s := range src.Sources {
		all = append(all, Source{Tier: s.Tier, Node: s.Node, Addr: s.Addr})
	}
	var p *partial
	if sources := a.rangedSources(all); len(sources) > 0 {
		p, err = a.openPartial(ctx, ps, sources)
		if err != nil {
			a.log.Warn("no source gave the header of a shard for a ranged read; fetching it whole", "job", job, "rank", rank, "step", step, "err", err)
		}
	}
	if p == nil {
		sh, lease, err := a.openOrPull(ctx, job, rank, step, false)
		if err != nil {
			return nil, nil, 0, false, err
		}
		return sh, sh.Leaves, lease, false, nil
	}
	id := newToken()
	a.mu.Lock()
	p.expires = a.cfg.Clock.Now().Add(a.cfg.LeaseTTL)
	a.partials[id] = p
	a.mu.Unlock()
	return p.info(), &tensorLeaves{names: p.names(), hashes: p.leaves}, id, true, nil
}

// openPartial fetches the shard's header and leaf hashes from the first
// of sources (peers' memory, tiers) that gives them, checked, and makes
// the sparse file.
func (a *Agent) openPartial(ctx context.Context, ps PeerShard, sources []Source) (*partial, error) {
	var errs []error
	for i, src := range sources {
		raw, h, leaves, err := a.headerFrom(ctx, ps, src)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			a.suspectTier(ps, src, err)
			continue
		}
		p := &partial{ps: ps, h: h, leaves: leaves, sources: sources, next: i, have: make([][]bool, len(leaves))}
		for t, l := range leaves {
			p.have[t] = make([]bool, len(l))
		}
		if err := a.makePartialFile(p, raw); err != nil {
			return nil, err
		}
		return p, nil
	}
	return nil, errors.Join(errs...)
}

// makePartialFile creates p's sparse file holding the header raw,
// charging the budget for it.
func (a *Agent) makePartialFile(p *partial, raw []byte) error {
	if err := a.reserveBudget(p.ps.Job, p.ps.Rank, 0, int64(len(raw))); err != nil {
		return err
	}
	p.charged = int64(len(raw))
	fail := func(err error) error {
		a.adjustUsed(p.ps.Job, -p.charged)
		return fmt.Errorf("agent: a partially open shard: %w", err)
	}
	if err := a.cfg.FS.MkdirAll(a.partialDir(), 0o700); err != nil {
		return fail(err)
	}
	p.path = filepath.Join(a.partialDir(), strconv.FormatUint(newToken(), 16)+".safetensors")
	f, err := a.cfg.FS.OpenFile(p.path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fail(err)
	}
	if err = f.Truncate(p.ps.Size); err == nil {
		_, err = f.WriteAt(raw, 0)
	}
	if err != nil {
		f.Close()
		_ = a.cfg.FS.Remove(p.path)
		return fail(err)
	}
	p.f = f
	return nil
}

func (p *partial) names() []string {
	out := make([]string, len(p.h.Tensors))
	for i, t := range p.h.Tensors {
		out[i] = t.Name
	}
	return out
}

// info is the shard as Open describes it; Slot is 0, Path the sparse file.
func (p *partial) info() *shardInfo {
	return &shardInfo{Job: p.ps.Job, Rank: p.ps.Rank, State: stateCommitted, Step: p.ps.Step, Size: p.ps.Size,
		WorldSize: p.h.Meta.WorldSize, Tensors: uint32(len(p.h.Tensors)), HeaderSum: p.ps.HeaderSum, Path: p.path}
}

// partialOf returns the partial open of a lease, or nil.
func (a *Agent) partialOf(id uint64) *partial {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.partials[id]
}

// releasePartial ends a partial lease: its file goes, and the budget it
// was charged comes back. It reports whether id was one.
func (a *Agent) releasePartial(id uint64) bool {
	a.mu.Lock()
	p := a.partials[id]
	delete(a.partials, id)
	a.mu.Unlock()
	if p == nil {
		return false
	}
	p.mu.Lock() // a Fill in flight finishes first
	defer p.mu.Unlock()
	p.f.Close()
	p.f = nil // a Fill that was waiting finds it released
	if err := a.cfg.FS.Remove(p.path); err != nil {
		a.log.Warn("could not remove a partially open shard", "path", p.path, "err", err)
	}
	a.adjustUsed(p.ps.Job, -p.charged)
	p.charged = 0
	return true
}

// partialSweep is how often partial leases past their TTL are released
// (also at a ranged Open, and when a save finds no budget left).
const partialSweep = 30 * time.Second

// sweepPartials releases expired partial leases until ctx ends.
func (a *Agent) sweepPartials(ctx context.Context) {
	t := time.NewTicker(partialSweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.expirePartials()
		}
	}
}

// expirePartials releases the partial leases past their TTL: a reader
// that died without releasing does not hold their memory for ever. It
// returns how many.
func (a *Agent) expirePartials() int {
	now := a.cfg.Clock.Now()
	a.mu.Lock()
	var old []uint64
	for id, p := range a.partials {
		if now.After(p.expires) {
			old = append(old, id)
		}
	}
	a.mu.Unlock()
	for _, id := range old {
		a.log.Warn("partial read lease expired without release", "lease", id)
		a.releasePartial(id)
	}
	return len(old)
}

// Fill fetches the leaves that byte ranges of a partial open touch and
// are not here yet, from the peers or tiers holding the shard, each
// checked against its hash before it is written. It returns the bytes
// fetched and the node (or tier) that served the last of them.
func (a *Agent) Fill(ctx context.Context, id uint64, ranges [][2]int64) (int64, string, error) {
	p := a.partialOf(id)
	if p == nil {
		// Not ErrNotFound: the shard may well be there (an agent restarted
		// since the open knows none of its leases), and a restore that
		// said "not found" would be taken for "no checkpoint".
		return 0, "", fmt.Errorf("%w: agent: no partial lease %d (expired, released, or the agent restarted since it was given); open the shard again", ErrBusy, id)
	}
	if len(ranges) > agentpb.MaxFillRanges {
		return 0, "", fmt.Errorf("%w: agent: %d ranges in one fill, at most %d", ErrInvalid, len(ranges), agentpb.MaxFillRanges)
	}
	for _, r := range ranges {
		if r[0] < p.h.DataStart || r[1] <= 0 || r[0] > p.ps.Size-r[1] {
			return 0, "", fmt.Errorf("%w: agent: range of %d bytes at %d outside the tensors of a %d-byte shard (data from %d)",
				ErrInvalid, r[1], r[0], p.ps.Size, p.h.DataStart)
		}
	}
	ranges = agentpb.MergedRanges(ranges) // at most the shard's bytes, each once
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.f == nil {
		return 0, "", fmt.Errorf("%w: agent: partial lease %d was released; open the shard again", ErrBusy, id)
	}
	runs := p.missing(ranges)
	var want int64
	for _, r := range runs {
		want += r.hi - r.lo
	}
	if want == 0 {
		return 0, "", nil
	}
	if err := a.reserveBudget(p.ps.Job, p.ps.Rank, 0, want); err != nil {
		return 0, "", err
	}
	p.charged += want
	var fetched int64
	defer func() { // what was not fetched is not held
		a.adjustUsed(p.ps.Job, -(want - fetched))
		p.charged -= want - fetched
	}()
	a.mu.Lock()
	p.expires = a.cfg.Clock.Now().Add(a.cfg.LeaseTTL) // in use: not expired under a long fill
	a.mu.Unlock()
	var errs []error
	for k := range p.sources {
		src := p.sources[(p.next+k)%len(p.sources)]
		n, err := a.fetchRuns(ctx, p, src, runs)
		fetched += n
		if err == nil {
			p.next = (p.next + k) % len(p.sources)
			return fetched, servedBy(src), nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", src, err))
		if ctx.Err() != nil {
			break
		}
		runs = p.missing(ranges) // what the failed source did write and check stays
	}
	return fetched, "", fmt.Errorf("agent: fetching ranges of job %s rank %d step %d: %w", p.ps.Job, p.ps.Rank, p.ps.Step, errors.Join(errs...))
}

// leafRun is leaves [first, last] of tensor t: bytes [lo, hi) of the shard.
type leafRun struct {
	t, first, last int
	lo, hi         int64
}

// missing returns the runs of leaves that ranges touch and p does not
// have, by tensor and leaf order.
func (p *partial) missing(ranges [][2]int64) []leafRun {
	need := make([][]bool, len(p.have))
	for _, r := range ranges {
		lo, hi := r[0]-p.h.DataStart, r[0]+r[1]-p.h.DataStart
		i, _ := slices.BinarySearchFunc(p.h.Tensors, lo, func(t shm.Tensor, off int64) int {
			if t.End <= off {
				return -1
			}
			return 1
		})
		for ; i < len(p.h.Tensors) && p.h.Tensors[i].Begin < hi; i++ {
			t := &p.h.Tensors[i]
			if t.End == t.Begin {
				continue
			}
			from, to := max(lo, t.Begin)-t.Begin, min(hi, t.End)-t.Begin
			for j := int(from / shm.LeafSize); int64(j)*shm.LeafSize < to; j++ {
				if !p.have[i][j] {
					if need[i] == nil {
						need[i] = make([]bool, len(p.have[i]))
					}
					need[i][j] = true
				}
			}
		}
	}
	var runs []leafRun
	for i, n := range need {
		t := &p.h.Tensors[i]
		for j := 0; j < len(n); j++ {
			if !n[j] {
				continue
			}
			k := j
			for k+1 < len(n) && n[k+1] {
				k++
			}
			base := p.h.DataStart + t.Begin
			runs = append(runs, leafRun{t: i, first: j, last: k,
				lo: base + int64(j)*shm.LeafSize, hi: min(base+int64(k+1)*shm.LeafSize, p.h.DataStart+t.End)})
			j = k
		}
	}
	return runs
}
