package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/shm"
)

// Slice is a box of a global tensor that a rank restores: its offset and
// length in every dimension, and the buffer its bytes go to (row-major,
// little-endian, len(Data) = element size × product of Lengths). Name is
// the name the global tensor's pieces were saved under, by every rank; a
// piece is a saved tensor with a Chunk, a tensor saved without one is the
// whole global tensor (a replicated one: any rank that saved it is a copy).
type Slice struct {
	Name    string
	DType   shm.DType
	Offsets []int64
	Lengths []int64
	Data    []byte
}

// Layout is what one rank of the new gang restores: the slices of global
// tensors its new world size gives it.
type Layout struct {
	Slices []Slice
	// ObjectsRank is the saved rank whose objects document (non-tensor
	// state) the restore returns: rank 0's unless the caller names another.
	ObjectsRank uint32
}

// Resharded is what RestoreInto read.
type Resharded struct {
	Job            string
	Step           int64
	SavedWorldSize uint32
	// Objects is the objects document of Layout.ObjectsRank, or nil.
	Objects json.RawMessage
	// Bytes is how many bytes were copied into the slices; Verified how
	// many were hashed to check the pieces they came from.
	Bytes, Verified int64
	// Fetched is how many bytes the agent fetched from other nodes'
	// memory for shards this node lacks: the 1 MiB leaves the slices'
	// ranges touch, not the shards whole.
	Fetched int64
}

// RestoreInto restores a checkpoint saved at any world size into the
// slices of layout: the job's latest consistent step (with a coordinator),
// or on a lone agent the newest step of which it holds every rank's shard.
// It reads every saved rank's shard of the step (from this node's shared
// memory, or fetched by the agent from a peer or a tier), verifies each
// piece it copies from against the piece's checksum, and copies exactly
// the bytes that overlap each slice. A corrupt piece is reported to the
// agent and another copy of it used if a rank saved one; else the error
// wraps ErrCorrupt and names the rank, tensor and step.
func (s *Session) RestoreInto(ctx context.Context, layout Layout) (*Resharded, error) {
	step, ok, err := s.LatestConsistent(ctx)
	switch {
	case errors.Is(err, ErrBusy): // no coordinator: what this node holds
		if step, err = s.newestComplete(ctx); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	case !ok:
		return nil, &Error{Op: fmt.Sprintf("reshard restore of job %s", s.job), Msg: "the job has no consistent step yet", kind: ErrNotFound}
	}
	return s.RestoreStepInto(ctx, step, layout)
}

// newestComplete returns the newest step of which the agent holds a
// committed shard of every rank of one world size. Shards of one step at
// two world sizes are two gangs' saves of it (a coordinator would have
// fenced the older): neither makes the other whole.
func (s *Session) newestComplete(ctx context.Context) (int64, error) {
	shards, err := s.c.List(ctx, s.job)
	if err != nil {
		return 0, err
	}
	type save struct {
		step  int64
		world uint32
	}
	ranks := map[save]map[uint32]bool{}
	for _, sh := range shards {
		if sh.State != agentpb.ShardState_SHARD_STATE_COMMITTED || sh.Rank >= sh.WorldSize {
			continue
		}
		k := save{sh.Step, sh.WorldSize}
		if ranks[k] == nil {
			ranks[k] = map[uint32]bool{}
		}
		ranks[k][sh.Rank] = true
	}
	best := int64(-1)
	for k, rs := range ranks {
		if k.step > best && len(rs) == int(k.world) {
			best = k.step
		}
	}
	if best < 0 {
		return 0, &Error{Op: fmt.Sprintf("reshard restore of job %s", s.job), Msg: "no step of which this node holds every rank's shard", kind: ErrNotFound}
	}
	return best, nil
}

// openShard is a saved rank's shard, leased and mapped for reading.
type openShard struct {
	sh     *agentpb.Shard
	h      *shm.Header
	m      *shm.Mapping
	lease  uint64
	leaves map[string][]uint64 // from the agent, when it has verified the shard
	// partial: another node's shard, its bytes readable once fetched
	// (reshard_fill.go); fillErr is why the first fetch failed.
	partial bool
	fillErr error
}

// RestoreStepInto is RestoreInto for a given step.
func (s *Session) RestoreStepInto(ctx context.Context, step int64, layout Layout) (*Resharded, error) {
	op := fmt.Sprintf("reshard restore of step %d of job %s into rank %d of %d", step, s.job, s.rank, s.worldSize)
	for i := range layout.Slices {
		if err := checkSlice(&layout.Slices[i]); err != nil {
			return nil, &Error{Op: op, Msg: err.Error(), kind: ErrInvalid}
		}
	}
	var shards []*openShard
	defer func() {
		var wg sync.WaitGroup
		for _, o := range shards {
			o.m.Close()
			wg.Go(func() { s.release(o.lease) })
		}
		wg.Wait()
	}()
	first, err := s.openPeer(ctx, step, 0)
	if err != nil {
		return nil, &Error{Op: op, Msg: err.Error(), kind: kindOf(err)}
	}
	shards = append(shards, first)
	n := first.h.Meta.WorldSize
	rest, err := s.openRest(ctx, step, n)
	shards = append(shards, rest...)
	if err != nil {
		return nil, &Error{Op: op, Msg: err.Error(), kind: kindOf(err)}
	}
	for r, o := range shards {
		if o.h.Meta.WorldSize != n {
			return nil, &Error{Op: op, Msg: fmt.Sprintf("rank %d was saved at world size %d, rank 0 at %d", r, o.h.Meta.WorldSize, n), kind: ErrCorrupt}
		}
	}
	if layout.ObjectsRank >= n {
		return nil, &Error{Op: op, Msg: fmt.Sprintf("objects of rank %d asked; step %d was saved at world size %d", layout.ObjectsRank, step, n), kind: ErrInvalid}
	}
	res := &Resharded{Job: s.job, Step: step, SavedWorldSize: n, Objects: shards[layout.ObjectsRank].h.Objects}
	if err := s.fill(ctx, step, shards, layout.Slices, res); err != nil {
		return nil, &Error{Op: op, Msg: err.Error(), kind: kindOf(err)}
	}
	return res, nil
}

// openRest opens the shards of ranks 1 to n-1 of step, up to openAtOnce
// at a time (each open is a call to the agent and a mapping). It returns
// those it opened, in rank order, for the caller to close, and every
// open's error.
func (s *Session) openRest(ctx context.Context, step int64, n uint32) ([]*openShard, error) {
	const openAtOnce = 8
	out := make([]*openShard, max(n, 1)-1)
	errs := make([]error, len(out))
	sem := make(chan struct{}, openAtOnce)
	var wg sync.WaitGroup
	for i := range out {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = s.openPeer(ctx, step, uint32(i+1))
		})
	}
	wg.Wait()
	opened := slices.DeleteFunc(out, func(o *openShard) bool { return o == nil })
	return opened, errors.Join(errs...)
}

func kindOf(err error) error {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.kind
	case errors.Is(err, shm.ErrCorrupt):
		return ErrCorrupt
	case errors.Is(err, ErrNotFound):
		return ErrNotFound
	case errors.Is(err, ErrInvalid):
		return ErrInvalid
	}
	return nil
}

// openPeer leases, maps (through a descriptor from the agent's segment
// socket: the shared-memory root is the agent's) and decodes rank's
// shard of step. Another rank's
// shard is opened as a peer reader: it does not count as that rank's
// restore during a recovery. An agent that restarted since the Open does
// not know its lease: the shard is opened again, once (as restore does).
func (s *Session) openPeer(ctx context.Context, step int64, rank uint32) (*openShard, error) {
	o, leaseLost, err := s.openPeerOnce(ctx, step, rank)
	if leaseLost {
		o, _, err = s.openPeerOnce(ctx, step, rank)
	}
	return o, err
}

func (s *Session) openPeerOnce(ctx context.Context, step int64, rank uint32) (_ *openShard, leaseLost bool, _ error) {
	cctx, cancel := s.c.call(ctx)
	// Every shard is read in parts: where the node lacks one, only those
	// are fetched (Ranged).
	req := &agentpb.OpenRequest{Job: s.job, Rank: rank, Step: step, Peer: rank != s.rank, Ranged: true}
	if req.Peer {
		req.ReaderRank = &s.rank
	}
	resp, err := s.c.api.Open(cctx, req)
	cancel()
	if err != nil {
		return nil, false, wrap(fmt.Sprintf("open rank %d", rank), err)
	}
	sh := resp.Shard
	fail := func(err error) (*openShard, bool, error) {
		s.release(resp.Lease)
		return nil, false, err
	}
	f, _, err := s.c.segs.open(ctx, s.c.opts.CallTimeout, &agentpb.SegmentRequest{Job: sh.Job, Rank: sh.Rank, Slot: sh.Slot,
		Grant: &agentpb.SegmentRequest_Lease{Lease: resp.Lease}})
	if err != nil {
		s.release(resp.Lease)
		err = wrap(fmt.Sprintf("segment of rank %d", rank), err)
		return nil, errors.Is(err, ErrBusy), err
	}
	m, err := shm.MapLazy(f, int64(sh.SizeBytes), false)
	f.Close()
	if err != nil {
		return fail(err)
	}
	h, err := shm.DecodeBytes(m.Data)
	switch {
	case err == nil && (!h.Rewind || h.Meta.Job != s.job || h.Meta.Rank != rank || h.Meta.Step != step):
		err = fmt.Errorf("%w: segment holds job %q rank %d step %d", shm.ErrCorrupt, h.Meta.Job, h.Meta.Rank, h.Meta.Step)
	case err == nil && sh.HeaderChecksum != "" && shm.HeaderSum(m.Data[:h.DataStart]) != sh.HeaderChecksum:
		err = fmt.Errorf("%w: header changed since it was committed", shm.ErrCorrupt)
	}
	if err != nil {
		m.Close()
		if errors.Is(err, shm.ErrCorrupt) && !resp.Partial {
			s.report(ctx, sh, err)
		}
		return fail(fmt.Errorf("rank %d step %d: %w", rank, step, err))
	}
	o := &openShard{sh: sh, h: h, m: m, lease: resp.Lease, leaves: map[string][]uint64{}, partial: resp.Partial}
	for _, l := range resp.Leaves {
		o.leaves[l.Tensor] = l.Hashes
	}
	return o, false, nil
}

// fill copies every slice's bytes from the pieces that overlap it. What
// is copied is verified first: the leaves of the piece it lies in when
// the agent gave the piece's leaf hashes (shm.VerifyRange: each leaf
// hashed once, however many slices read it), else the whole piece, once.
func (s *Session) fill(ctx context.Context, step int64, shards []*openShard, want []Slice, res *Resharded) error {
	byName := map[string][]*piece{}
	for _, o := range shards {
		for i := range o.h.Tensors {
			t := &o.h.Tensors[i]
			data := o.m.Data[o.h.DataStart+t.Begin : o.h.DataStart+t.End]
			p := newPiece(o.h.Meta.Rank, t, data)
			p.leaves = o.leaves[t.Name]
			byName[t.Name] = append(byName[t.Name], p)
		}
	}
	if slices.ContainsFunc(shards, func(o *openShard) bool { return o.partial }) {
		if err := s.prefill(ctx, shards, byName, want, res); err != nil {
			return err
		}
	}
	for i := range want {
		sl := &want[i]
		pieces := byName[sl.Name]
		if len(pieces) == 0 {
			return fmt.Errorf("%w: no rank saved tensor %q at step %d", ErrNotFound, sl.Name, step)
		}
		groups, err := cover(sl, pieces)
		if err != nil {
			return err
		}
		es := sl.DType.Size()
		for _, copies := range groups {
			lo, n, _ := intersect(copies[0].offs, copies[0].t.Shape, sl.Offsets, sl.Lengths)
			var run []byte // the copies of a group hold the same box
			if _, dst, length, ok := oneRun(sl.Offsets, sl.Lengths, copies[0].offs, copies[0].t.Shape, lo, n, es); ok {
				run = sl.Data[dst : dst+length]
			}
			p, copied, err := s.verified(ctx, step, shards, copies, sl, lo, n, es, run, res)
			if err != nil {
				return err
			}
			if !copied {
				copyBox(sl.Data, sl.Offsets, sl.Lengths, p.data, p.offs, p.t.Shape, lo, n, es)
			}
			res.Bytes += volume(n) * es
		}
	}
	return nil
}

// verified returns the first of copies whose bytes holding the box
// (lo, n) match their checksum. A corrupt copy is reported to its agent,
// which serves that shard no more. Where the box is one run of bytes in
// the piece and the slice (run: where it goes, else nil) and the piece's
// leaf hashes are known, the run is copied as its leaves are checked, in
// one pass: copied says so. With no good copy left the error wraps
// ErrCorrupt, unless a copy could not be fetched for another reason than
// its bytes (the agent out of budget, a peer gone): then it is of that
// reason's kind, for the caller to retry, not to give the step up.
func (s *Session) verified(ctx context.Context, step int64, shards []*openShard, copies []*piece, sl *Slice, lo, n []int64, es int64,
	run []byte, res *Resharded) (_ *piece, copied bool, _ error) {
	var problems []string
	var unread error // the first copy that could not be fetched for another reason than its bytes
	for i, p := range copies {
		if p.bad {
			continue
		}
		if err := s.ready(ctx, shards, p, i, sl, res); err != nil {
			p.bad = true
			problems = append(problems, fmt.Sprintf("tensor %q of rank %d at step %d: %v", p.t.Name, p.rank, step, err))
			if unread == nil && !errors.Is(err, ErrCorrupt) {
				unread = err
			}
			continue
		}
		var err error
		switch {
		case p.whole:
		case p.leaves != nil && p.t.HasSum:
			if p.leafOK == nil {
				p.leafOK = map[int]bool{}
			}
			blo, bhi := p.byteRange(lo, n, es)
			var hashed int64
			if run != nil {
				hashed, err = shm.VerifyCopyRange(run, p.data, blo, bhi, p.leaves, p.t.Sum, p.leafOK, s.c.opts.Workers)
				copied = err == nil
			} else {
				hashed, err = shm.VerifyRange(p.data, blo, bhi, p.leaves, p.t.Sum, p.leafOK)
			}
			res.Verified += hashed
		default:
			res.Verified += p.t.Len()
			if sum := shm.CopyAndSum([]shm.Copy{{Src: p.data}}, s.c.opts.Workers)[0]; !p.t.HasSum || sum != p.t.Sum {
				err = fmt.Errorf("%w: checksum %s, header says %s", shm.ErrCorrupt, shm.FormatSum(sum), shm.FormatSum(p.t.Sum))
			}
			p.whole = err == nil
		}
		if err == nil {
			return p, copied, nil
		}
		p.bad = true
		err = fmt.Errorf("tensor %q of rank %d at step %d: %w", p.t.Name, p.rank, step, err)
		if !shards[p.rank].partial { // the agent checked what it fetched; this node holds no copy to mark
			s.report(ctx, shards[p.rank].sh, err)
		}
		problems = append(problems, err.Error())
	}
	if unread != nil { // not the bytes' fault: the caller sees why (out of budget, a peer gone)
		return nil, false, &Error{Op: "no copy could be read", Msg: strings.Join(problems, "; "), kind: kindOf(unread)}
	}
	return nil, false, fmt.Errorf("%w: no good copy left: %s", shm.ErrCorrupt, strings.Join(problems, "; "))
}
