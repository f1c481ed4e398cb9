package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/shm"
)

// Tensor is one named tensor: its element type, shape and bytes (row-major,
// little-endian, len(Data) = element size × product of Shape).
type Tensor struct {
	Name  string
	DType shm.DType
	Shape []int64
	Data  []byte
	// Chunk places this tensor in a larger sharded tensor; nil if it is whole.
	Chunk *shm.Chunk
}

// Checkpoint is what Restore returns.
type Checkpoint struct {
	Job     string
	Rank    uint32
	Step    int64
	Tensors []Tensor // in the order they lie in the shard
	// Objects is the JSON of the non-tensor state given to Save, or nil.
	Objects json.RawMessage
	// byName indexes Tensors as Restore returned them: a caller looks up
	// every tensor of its state, 100,000 and more in a large optimizer's.
	byName map[string]int
}

// Tensor returns the tensor with the given name, or nil.
func (c *Checkpoint) Tensor(name string) *Tensor {
	if i, ok := c.byName[name]; ok && i < len(c.Tensors) && c.Tensors[i].Name == name {
		return &c.Tensors[i]
	}
	for i := range c.Tensors { // not indexed, or changed since
		if c.Tensors[i].Name == name {
			return &c.Tensors[i]
		}
	}
	return nil
}

// SaveStats describes the last save of a session.
type SaveStats struct {
	Step    int64
	Bytes   int64         // shard size
	Cold    bool          // the segment was created or resized, or newly mapped
	Prepare time.Duration // asking the agent for a slot (and sizing it when cold)
	Map     time.Duration // mapping the segment (cold only)
	Copy    time.Duration // copying and checksumming the tensors
	Commit  time.Duration
	Total   time.Duration
}

// Session saves and restores one rank of one job. Its methods must not be
// called concurrently; each rank has its own session.
type Session struct {
	c         *Client
	job       string
	rank      uint32
	worldSize uint32
	maps      map[string]*segmentMap
	last      SaveStats
	mu        sync.Mutex
	// epoch is the job's epoch this rank belongs to, as the agent's answer
	// to its first save told it (0 before): every later save names it, and
	// a save after a re-gang replaced this rank's gang fails with
	// ErrGangBroken (the agent fences it).
	epoch atomic.Uint64
}

// segmentMap is a slot's segment kept mapped between saves.
type segmentMap struct {
	m    *shm.Mapping
	size int64
	id   uint64 // the segment file's inode number
}

// testHookLeased, when set (by tests), runs in a restore between the
// agent's lease on the shard and the request for its descriptor.
var testHookLeased func()

// LastSave returns the timings of the last successful Save.
func (s *Session) LastSave() SaveStats { return s.last }

// Save writes step's tensors and objects (anything encoding/json accepts,
// or nil) into shared memory and commits them. It returns only once the
// agent has committed the shard: a crash after Save returns cannot lose the
// step, and a crash before cannot damage the previous one. The tensors'
// bytes must not change while Save runs.
func (s *Session) Save(ctx context.Context, step int64, tensors []Tensor, objects any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	op := fmt.Sprintf("save step %d of job %s rank %d", step, s.job, s.rank)
	start := time.Now()
	var obj []byte
	if objects != nil {
		var err error
		if obj, err = json.Marshal(objects); err != nil {
			return &Error{Op: op, Msg: "encoding objects: " + err.Error(), kind: ErrInvalid}
		}
	}
	specs := make([]shm.TensorSpec, len(tensors))
	data := make(map[string][]byte, len(tensors))
	for i, t := range tensors {
		specs[i] = shm.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape, Chunk: t.Chunk}
		data[t.Name] = t.Data
	}
	layout, err := shm.NewLayout(shm.ShardMeta{Job: s.job, Rank: s.rank, WorldSize: s.worldSize, Step: step}, specs, obj)
	if err != nil {
		return &Error{Op: op, Msg: err.Error(), kind: ErrInvalid}
	}
	for _, t := range layout.Tensors {
		if int64(len(data[t.Name])) != t.Len() {
			return &Error{Op: op, Msg: fmt.Sprintf("tensor %q: %s%v needs %d bytes, data has %d", t.Name, t.DType, t.Shape, t.Len(), len(data[t.Name])), kind: ErrInvalid}
		}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Op: op, Msg: err.Error(), kind: ErrTimeout}
	}
	st := SaveStats{Step: step, Bytes: layout.Size}

	cctx, cancel := s.c.call(ctx)
	prep, err := s.c.api.Prepare(cctx, &agentpb.PrepareRequest{Job: s.job, Rank: s.rank, WorldSize: s.worldSize, Step: step, SizeBytes: uint64(layout.Size),
		Epoch: s.epoch.Load()})
	cancel()
	if err != nil {
		return wrap(op, err)
	}
	s.epoch.CompareAndSwap(0, prep.Epoch)
	st.Prepare = time.Since(start)
	if int64(prep.SizeBytes) != layout.Size {
		return &Error{Op: op, Msg: fmt.Sprintf("agent sized the segment %d bytes, %d asked", prep.SizeBytes, layout.Size)}
	}
	t0 := time.Now()
	seg, cold, err := s.mapSegment(ctx, prep, layout.Size)
	if err != nil {
		return wrap(op, err)
	}
	st.Cold, st.Map = cold || prep.Resized, time.Since(t0)

	t0 = time.Now()
	copies := make([]shm.Copy, len(layout.Tensors))
	for i, t := range layout.Tensors {
		copies[i] = shm.Copy{Dst: seg.Data[layout.DataStart+t.Begin : layout.DataStart+t.End], Src: data[t.Name]}
	}
	for i, sum := range shm.CopyAndSum(copies, s.c.opts.Workers) {
		layout.SetSum(i, sum)
	}
	copy(seg.Data, layout.Header())
	st.Copy = time.Since(t0)

	t0 = time.Now()
	cctx, cancel = s.c.call(ctx)
	_, err = s.c.api.Commit(cctx, &agentpb.CommitRequest{Job: s.job, Rank: s.rank, Slot: prep.Slot, Token: prep.Token, Step: step, HeaderChecksum: shm.HeaderSum(layout.Header())})
	cancel()
	if err != nil {
		return wrap(op, err)
	}
	st.Commit = time.Since(t0)
	st.Total = time.Since(start)
	s.last = st
	return nil
}

// mapSegment returns the mapping of a prepared slot's segment, reusing
// the one kept from an earlier save when the agent names the same file
// (segment id) at the same size: a warm save makes no system call of its
// own. Otherwise the agent passes the segment's descriptor over the
// segment socket, for this save's token, and it is mapped and kept.
func (s *Session) mapSegment(ctx context.Context, prep *agentpb.PrepareResponse, size int64) (*shm.Mapping, bool, error) {
	if sm := s.maps[prep.Path]; sm != nil {
		if !prep.Resized && prep.SegmentId != 0 && sm.size == size && sm.id == prep.SegmentId {
			return sm.m, false, nil
		}
		sm.m.Close()
		delete(s.maps, prep.Path)
	}
	f, resp, err := s.c.segs.open(ctx, s.c.opts.CallTimeout, &agentpb.SegmentRequest{Job: s.job, Rank: s.rank, Slot: prep.Slot,
		Grant: &agentpb.SegmentRequest_SaveToken{SaveToken: prep.Token}})
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	m, err := shm.Map(f, size, true)
	if err != nil {
		return nil, false, err
	}
	s.maps[prep.Path] = &segmentMap{m: m, size: size, id: resp.SegmentId}
	return m, true, nil
}

// Latest returns the rank's latest committed step, or ok=false when it has
// none.
func (s *Session) Latest(ctx context.Context) (step int64, ok bool, err error) {
	cctx, cancel := s.c.call(ctx)
	defer cancel()
	resp, err := s.c.api.Open(cctx, &agentpb.OpenRequest{Job: s.job, Rank: s.rank, Latest: true})
	if err != nil {
		err = wrap(fmt.Sprintf("latest of job %s rank %d", s.job, s.rank), err)
		if errors.Is(err, ErrNotFound) {
			return 0, false, nil
		}
		return 0, false, err
	}
	s.release(resp.Lease)
	return resp.Shard.Step, true, nil
}

// LatestConsistent returns the job's latest consistent step — the newest
// step every rank has committed — as the coordinator knows it, or ok=false
// when there is none yet. It needs an agent started with --coordinator.
func (s *Session) LatestConsistent(ctx context.Context) (step int64, ok bool, err error) {
	cctx, cancel := s.c.call(ctx)
	defer cancel()
	resp, err := s.c.api.Consistent(cctx, &agentpb.ConsistentRequest{Job: s.job})
	if err != nil {
		err = wrap(fmt.Sprintf("latest consistent step of job %s", s.job), err)
		if errors.Is(err, ErrNotFound) {
			return 0, false, nil
		}
		return 0, false, err
	}
	return resp.Step, resp.Step >= 0, nil
}

// Restore returns the checkpoint to resume from, bit-identical to what Save
// was given, its checksums verified as it is copied out. With a coordinator
// that is the job's latest consistent step, the same on every rank, so no
// restore mixes steps across ranks; an agent running alone restores the
// rank's latest committed step. An error wrapping ErrNotFound means there is
// none; ErrCorrupt means the bytes did not match (the agent then never
// serves that shard again).
func (s *Session) Restore(ctx context.Context) (*Checkpoint, error) {
	step, ok, err := s.LatestConsistent(ctx)
	switch {
	case errors.Is(err, ErrBusy): // no coordinator: this rank alone decides
		return s.restore(ctx, &agentpb.OpenRequest{Job: s.job, Rank: s.rank, Latest: true})
	case err != nil:
		return nil, err
	case !ok:
		return nil, &Error{Op: fmt.Sprintf("restore job %s rank %d", s.job, s.rank), Msg: "the job has no consistent step yet (no step every rank committed)", kind: ErrNotFound}
	}
	return s.RestoreStep(ctx, step)
}

// RestoreStep returns the rank's checkpoint of a given step.
func (s *Session) RestoreStep(ctx context.Context, step int64) (*Checkpoint, error) {
	return s.restore(ctx, &agentpb.OpenRequest{Job: s.job, Rank: s.rank, Step: step})
}

// restore opens the shard req names and copies it out. An agent that
// restarted between the Open and the request for the shard's descriptor
// does not know the lease it gave (ErrBusy): the shard is opened again,
// once.
func (s *Session) restore(ctx context.Context, req *agentpb.OpenRequest) (*Checkpoint, error) {
	op := fmt.Sprintf("restore job %s rank %d", s.job, s.rank)
	if !req.Latest {
		op = fmt.Sprintf("restore step %d of job %s rank %d", req.Step, s.job, s.rank)
	}
	ckpt, leaseLost, err := s.restoreOnce(ctx, req, op)
	if leaseLost {
		ckpt, _, err = s.restoreOnce(ctx, req, op)
	}
	return ckpt, err
}

// restoreOnce is one try of restore; leaseLost says the agent no longer
// knew the lease it gave.
func (s *Session) restoreOnce(ctx context.Context, req *agentpb.OpenRequest, op string) (_ *Checkpoint, leaseLost bool, _ error) {
	cctx, cancel := s.c.call(ctx)
	resp, err := s.c.api.Open(cctx, req)
	cancel()
	if err != nil {
		return nil, false, wrap(op, err)
	}
	defer s.release(resp.Lease)
	if testHookLeased != nil {
		testHookLeased()
	}
	sh := resp.Shard
	f, _, err := s.c.segs.open(ctx, s.c.opts.CallTimeout, &agentpb.SegmentRequest{Job: sh.Job, Rank: sh.Rank, Slot: sh.Slot,
		Grant: &agentpb.SegmentRequest_Lease{Lease: resp.Lease}})
	if err != nil {
		err = wrap(op, err)
		return nil, errors.Is(err, ErrBusy), err
	}
	m, err := shm.Map(f, int64(sh.SizeBytes), false)
	f.Close()
	if err != nil {
		return nil, false, &Error{Op: op, Msg: err.Error()}
	}
	defer m.Close()
	ckpt, err := decodeInto(m.Data, sh, s.c.opts.Workers)
	if err != nil {
		if errors.Is(err, shm.ErrCorrupt) {
			s.report(ctx, sh, err)
			return nil, false, &Error{Op: op, Msg: err.Error(), kind: ErrCorrupt}
		}
		return nil, false, &Error{Op: op, Msg: err.Error()}
	}
	return ckpt, false, nil
}

// decodeInto copies a mapped shard into fresh buffers, verifying it.
func decodeInto(b []byte, sh *agentpb.Shard, workers int) (*Checkpoint, error) {
	h, err := shm.DecodeBytes(b)
	if err != nil {
		return nil, err
	}
	if !h.Rewind || h.Meta.Job != sh.Job || h.Meta.Rank != sh.Rank || h.Meta.Step != sh.Step {
		return nil, fmt.Errorf("%w: segment holds job %q rank %d step %d, agent said job %q rank %d step %d",
			shm.ErrCorrupt, h.Meta.Job, h.Meta.Rank, h.Meta.Step, sh.Job, sh.Rank, sh.Step)
	}
	if sh.HeaderChecksum != "" && shm.HeaderSum(b[:h.DataStart]) != sh.HeaderChecksum {
		return nil, fmt.Errorf("%w: header of step %d changed since it was committed", shm.ErrCorrupt, sh.Step)
	}
	ckpt := &Checkpoint{Job: h.Meta.Job, Rank: h.Meta.Rank, Step: h.Meta.Step, Objects: h.Objects, byName: make(map[string]int, len(h.Tensors))}
	dst := make([][]byte, len(h.Tensors))
	for i, t := range h.Tensors {
		ckpt.byName[t.Name] = i
		dst[i] = make([]byte, t.Len())
		ckpt.Tensors = append(ckpt.Tensors, Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Data: dst[i], Chunk: t.Chunk})
	}
	if err := h.CopyOut(b, dst, workers); err != nil {
		return nil, err
	}
	return ckpt, nil
}

func (s *Session) report(ctx context.Context, sh *agentpb.Shard, problem error) {
	cctx, cancel := s.c.call(context.WithoutCancel(ctx))
	defer cancel()
	_, _ = s.c.api.ReportCorrupt(cctx, &agentpb.VerifyRequest{Job: sh.Job, Rank: sh.Rank, Step: sh.Step, Detail: problem.Error()})
}

func (s *Session) release(lease uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = s.c.api.Release(ctx, &agentpb.ReleaseRequest{Lease: lease})
}

// Close unmaps the session's segments.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, sm := range s.maps {
		sm.m.Close()
		delete(s.maps, p)
	}
	return nil
}
