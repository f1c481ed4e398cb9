package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/shm"
)

// slotState is the life of a segment slot:
//
//	free ──Prepare──▶ writing ──Commit──▶ committed ──Prepare (oldest, not latest)──▶ writing
//	                     │                     │
//	                     └─Prepare again──▶ writing (the unfinished save is abandoned)
//	                     │                     └─checksum mismatch──▶ corrupt ──Prepare──▶ writing
//	                     └─a restore's fetch──▶ staged ──FinishRestore──▶ committed, or free
//
// A staged slot (stage.go) holds a shard a restore fetched and verified
// but has not switched to yet: it is neither served nor reported, and no
// save takes it until the restore finishes or stageTTL passes.
type slotState string

const (
	stateFree      slotState = "free"
	stateWriting   slotState = "writing"
	stateCommitted slotState = "committed"
	stateCorrupt   slotState = "corrupt"
	stateStaged    slotState = "staged"
)

// proto returns the state as the agent's API shows it.
func (s slotState) proto() agentpb.ShardState {
	switch s {
	case stateFree:
		return agentpb.ShardState_SHARD_STATE_FREE
	case stateWriting:
		return agentpb.ShardState_SHARD_STATE_WRITING
	case stateCommitted:
		return agentpb.ShardState_SHARD_STATE_COMMITTED
	case stateCorrupt:
		return agentpb.ShardState_SHARD_STATE_CORRUPT
	case stateStaged:
		return agentpb.ShardState_SHARD_STATE_STAGED
	}
	return agentpb.ShardState_SHARD_STATE_UNSPECIFIED
}

// slot is one segment of a rank. Guarded by its rank's mutex.
type slot struct {
	Index       uint32    `json:"slot"`
	State       slotState `json:"state"`
	Step        int64     `json:"step"`
	Seq         uint64    `json:"seq,omitempty"`
	Size        int64     `json:"size"`
	WorldSize   uint32    `json:"world_size,omitempty"`
	Tensors     uint32    `json:"tensors,omitempty"`
	HeaderSum   string    `json:"header_checksum,omitempty"`
	CommittedAt int64     `json:"committed_unix_nano,omitempty"`
	Problem     string    `json:"problem,omitempty"`
	// Replica: the segment holds a copy of a rank that runs on another
	// node; under budget pressure it gives way to the node's own saves.
	Replica bool `json:"replica,omitempty"`
	// Stage: the restore a staged slot was fetched for (stage.go).
	Stage string `json:"stage,omitempty"`
	// Epoch: the job's epoch the saving rank belonged to, or for a copy
	// the one this agent knew when it made it (epoch.go); 0: not known.
	Epoch uint64 `json:"epoch,omitempty"`

	stagedAt   time.Time // when it was staged; a restore that never finishes gives it up after stageTTL
	preparedAt time.Time // when a save's Prepare took it: rewind_agent_save_seconds runs from it; never committed, it expires after PrepareTTL (prepares.go)

	verified bool
	copying  bool          // written by the agent itself, not a save (prepare's copying); not taken over while writing
	leaves   *tensorLeaves // what the verification that set verified hashed; nil when unknown
	token    uint64        // owner of a writing slot
	readers  int           // open leases and streams
	// verifying is closed when a verification pass over the segment ends;
	// nil when none runs. A save may take the slot, but waits for it.
	verifying chan struct{}
}

// rankState holds the slots of one rank of one job.
type rankState struct {
	job   string
	rank  uint32
	slots []*slot
}

// latest returns the committed slot with the highest commit sequence.
func (r *rankState) latest() *slot {
	var best *slot
	for _, s := range r.slots {
		if s.State == stateCommitted && (best == nil || s.Seq > best.Seq) {
			best = s
		}
	}
	return best
}

// find returns the newest committed slot holding step.
func (r *rankState) find(step int64) *slot {
	var best *slot
	for _, s := range r.slots {
		if s.State == stateCommitted && s.Step == step && (best == nil || s.Seq > best.Seq) {
			best = s
		}
	}
	return best
}

// twin returns another committed slot of r that holds the copy s held as
// the coordinator knows it (the same step and header checksum: a save
// retried with the same bytes, or a replica made twice), or nil. Such a
// slot going is not the copy going.
func (r *rankState) twin(s *slot) *slot {
	for _, o := range r.slots {
		if o != s && o.State == stateCommitted && o.Step == s.Step && o.HeaderSum == s.HeaderSum {
			return o
		}
	}
	return nil
}

// gone tells the coordinator that the committed or corrupt copy s held
// left r (s is what the slot held; the slot may be reused already),
// unless a twin still holds it: a corrupt slot's twin was reported
// committed again when the corruption was found (verify.go), and the
// deletion, which names the checksum they share, would remove it. The
// caller holds r's mutex.
func (a *Agent) gone(r *rankState, s *slot) {
	if s.State != stateCommitted && s.State != stateCorrupt || r.twin(s) != nil {
		return
	}
	a.rep.shard(r.job, r.rank, s.WorldSize, s.Step, s.Size, s.HeaderSum, coordpb.CopyState_COPY_STATE_DELETED)
}

// keptSteps counts the distinct steps of r's committed slots that a save
// must not take under pins: its latest, the pinned ones and, for a rank's
// own save, those newer than the consistent step.
func (r *rankState) keptSteps(pins pinSet, replica bool) int {
	latest := r.latest()
	kept := map[int64]bool{}
	for _, s := range r.slots {
		if s.State == stateCommitted && (s == latest && !replica || pins.holds(s.Step) || !replica && pins.unconfirmed(s.Step)) {
			kept[s.Step] = true
		}
	}
	return len(kept)
}

// pick chooses the slot a new save writes into, or nil when every slot is
// the latest checkpoint, a step the job's pins hold (for a rank's own
// save, also a step newer than the consistent one: pinSet.newer), being
// read, or (for a replica) being written. Preference: an unused slot of the right size (warm), any unused
// slot, a new slot while fewer than max exist, the oldest committed slot
// that is not the latest, then a new slot beside those being read.
func (r *rankState) pick(size int64, max int, pins pinSet, replica bool) *slot {
	latest := r.latest()
	if replica || latest != nil && latest.Step < pins.consistent {
		// A replica: see pickSlot. A newest slot older than the job's
		// consistent step (a replica of an older step written after
		// the rank's own save, as a node's loss makes) holds nothing a
		// restore would take: the consistent step is newer, and pinned.
		latest = nil
	}
	// A pin holds one copy of its step: the newest. A rank restarted in
	// place before its step became consistent resumes the step before and
	// saves the same step again; the older copy is free to take, or the
	// pin would hold both and leave no slot.
	pinned := map[int64]*slot{}
	for _, s := range r.slots {
		if s.State == stateCommitted && pins.holds(s.Step) && (pinned[s.Step] == nil || s.Seq > pinned[s.Step].Seq) {
			pinned[s.Step] = s
		}
	}
	var unused, oldest *slot
	held := 0
	for _, s := range r.slots {
		copying := s.State == stateWriting && s.copying
		if s.readers > 0 || s.State == stateStaged || copying {
			held++
		}
		if s == latest || s.readers > 0 || s.State == stateStaged || copying ||
			s.State == stateCommitted && (pinned[s.Step] == s || !replica && pins.unconfirmed(s.Step)) {
			continue
		}
		if replica && s.State == stateWriting {
			// The rank's own save in flight (on a node where a new gang
			// placed the rank, while the step before is replicated
			// there): a replica never takes it over. One abandoned is
			// freed when its Prepare expires (prepares.go).
			continue
		}
		switch s.State {
		case stateFree, stateWriting, stateCorrupt:
			if s.Size == size {
				return s
			}
			if unused == nil {
				unused = s
			}
		case stateCommitted:
			if oldest == nil || s.Seq < oldest.Seq {
				oldest = s
			}
		}
	}
	if unused != nil {
		return unused
	}
	if len(r.slots) < max {
		return r.newSlot()
	}
	if oldest != nil {
		return oldest
	}
	// A slot being read (a tier transfer, a peer's restore), copied into
	// by the agent or staged by a restore does not count against max:
	// rather than wait for the reader or the restore, the save gets one
	// more segment, so reading a checkpoint never stalls training. The extra
	// segment stays and joins the rotation; the budget still bounds it.
	if len(r.slots)-held < max {
		return r.newSlot()
	}
	return nil
}

// pickSlot picks the slot for a save; the caller holds r.mu. A slot whose
// segment is being verified is taken once the pass ends: the pass maps the
// file, which must not shrink under it.
//
// A replica (of a rank that runs elsewhere) may replace the newest replica
// the node holds, which is not yet the job's consistent step, and gets one
// slot more: it arrives at every commit, up to two steps ahead of the
// consistent step that must stay.
//
// While the job's protected step (the newest that outlives a node's loss)
// is older than its consistent step, the rank gets one more slot again,
// so that neither pin holds a save back, and one more for each step it
// saved past the consistent one (the other ranks have not committed it
// yet; any may complete), up to maxAhead beyond its slots. The extra
// segments stay in the rotation. Where the budget has no room for them,
// the protected step gives way rather than the save.
func (a *Agent) pickSlot(ctx context.Context, r *lockedRank, size int64, replica bool) (*slot, error) {
	max := a.cfg.SlotsPerRank
	if replica {
		max++
	}
	pinDeadline := a.cfg.Clock.Now().Add(a.cfg.PinWait)
	refreshed := false
	for {
		a.expireLeases(r)
		a.expireStaged(r)
		pins := a.rep.pinned(r.job)
		s := a.pickPinned(r, size, max, pins, replica)
		if s != nil && !replica && !refreshed && s == r.latest() {
			// The rank's newest slot, free only because the pins name a
			// newer consistent step (rankState.pick). The coordinator can
			// take that step back when copies are lost, and its answer
			// saying so may be on its way: ask it first.
			refreshed = true
			if a.refreshPins(ctx, r) != pins {
				continue
			}
		}
		if s == nil && r.pick(size, max, noPins, replica) != nil {
			// Only the job's pins hold the slot back. In synchronous
			// training the other ranks have committed the next step
			// already and their reports are on the way: ask the
			// coordinator until the pins move or PinWait runs out.
			if a.refreshPins(ctx, r) != pins {
				continue
			}
			s = a.abandonedLatest(ctx, r, pins)
			if s == nil && a.cfg.Clock.Now().Before(pinDeadline) && ctx.Err() == nil {
				r.mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				r.mu.Lock()
				continue
			}
		}
		if s == nil {
			return nil, fmt.Errorf("%w: agent: all %d slots of job %s rank %d hold its latest checkpoint (step %d), the job's latest consistent step (%d), its protected step (%d) or are being read; raise --slots",
				ErrBusy, len(r.slots), r.job, r.rank, latestStep(&r.rankState), pins.consistent, pins.protected)
		}
		done := s.verifying
		if done == nil {
			return s, nil
		}
		r.mu.Unlock()
		select {
		case <-done:
			r.mu.Lock()
		case <-ctx.Done():
			r.mu.Lock()
			return nil, fmt.Errorf("agent: waiting for a verification of job %s rank %d: %w", r.job, r.rank, ctx.Err())
		}
	}
}

// refreshPins asks the coordinator for the job's pins, with r.mu let go
// meanwhile; the caller holds r.mu.
func (a *Agent) refreshPins(ctx context.Context, r *lockedRank) pinSet {
	r.mu.Unlock()
	defer r.mu.Lock()
	a.metrics.pinRefreshes.Inc()
	return a.rep.refreshPin(ctx, r.job)
}

// pickPinned is r.pick under the job's pins, with the extra slot of a split
// pin (see pickSlot) where the budget has room for it; the caller holds
// r.mu.
func (a *Agent) pickPinned(r *lockedRank, size int64, max int, pins pinSet, replica bool) *slot {
	if !pins.split() {
		return r.pick(size, max, pins, replica)
	}
	// One slot more than max, and as many as the steps the save must not
	// take need beside it (its latest and the steps newer than the
	// consistent one, which may be consistent already, and both pins), up
	// to maxAhead more: ranks running ahead while a peer's save fails or
	// its node dies would take the protected step otherwise.
	extra := max + 1
	if need := r.keptSteps(pins, replica) + 1; need > extra {
		extra = min(need, max+maxAhead)
	}
	if len(r.slots) >= max && a.budgetLeft(r.job) < size {
		extra = max // no room for one more segment: the protected step may go
	}
	if s := r.pick(size, extra, pins, replica); s != nil {
		return s
	}
	s := r.pick(size, max, pinSet{consistent: pins.consistent, protected: -1, newer: pins.newer}, replica)
	if s != nil && s.State == stateCommitted && s.Step == pins.protected {
		a.log.Warn("the job's protected step (the newest that outlives a node's loss) gives way to a save: no slot or budget left for both pins; raise --slots or the budget",
			"job", r.job, "rank", r.rank, "protected", pins.protected, "consistent", pins.consistent)
	}
	return s
}

// maxAhead bounds the extra slots of a split pin (pickPinned).
const maxAhead = 4

// abandonedLatest returns a slot for a save when only the rank's latest
// checkpoint and the job's consistent step hold them all, and the
// coordinator says that latest step is abandoned: some rank moved past it
// without committing it (its save failed), so it can never become
// consistent nor be restored, and keeping it would leave every later step
// of the job without this rank's shard. The caller holds r's lock; it is
// released during the call to the coordinator.
func (a *Agent) abandonedLatest(ctx context.Context, r *lockedRank, pins pinSet) *slot {
	latest := r.latest()
	if latest == nil || latest.Step <= pins.consistent {
		return nil
	}
	step := latest.Step
	r.mu.Unlock()
	abandoned := a.rep.abandoned(ctx, r.job, step)
	r.mu.Lock()
	if !abandoned {
		return nil
	}
	s := r.latest()
	if s == nil || s.Step != step {
		return nil // changed meanwhile: the caller looks again
	}
	// Every other slot is pinned, newer than the consistent step (which
	// may be consistent: pinSet.newer) or being read, or the caller's
	// pick would have had it: the latest slot goes, unless it is read.
	if s.readers > 0 {
		return nil
	}
	a.log.Warn("the rank's latest checkpoint was abandoned by the job (a rank moved on without it): its slot is reused",
		"job", r.job, "rank", r.rank, "step", step, "consistent", pins.consistent)
	return s
}

func (r *rankState) newSlot() *slot {
	s := &slot{Index: r.nextIndex(), State: stateFree}
	r.slots = append(r.slots, s)
	return s
}

func (r *rankState) nextIndex() uint32 {
	used := map[uint32]bool{}
	for _, s := range r.slots {
		used[s.Index] = true
	}
	var i uint32
	for used[i] {
		i++
	}
	return i
}

// slotsFile is the on-shm record of a rank's slots. It lives on tmpfs beside
// the segments, so it survives an agent restart and dies with the node, like
// the data it describes.
type slotsFile struct {
	Job   string  `json:"job"`
	Rank  uint32  `json:"rank"`
	Slots []*slot `json:"slots"`
}

// persist writes the rank's slot states atomically (temporary file, rename).
func (a *Agent) persist(r *rankState) error {
	b, err := json.Marshal(slotsFile{Job: r.job, Rank: r.rank, Slots: r.slots})
	if err != nil {
		return err
	}
	path := a.paths.SlotsFile(r.job, r.rank)
	if err := a.cfg.FS.MkdirAll(a.paths.RankDir(r.job, r.rank), a.segs.FileMode|0o700); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	tmp := path + ".tmp"
	f, err := a.cfg.FS.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, a.segs.FileMode)
	if err != nil {
		return fmt.Errorf("agent: writing slot states: %w", err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		f.Close()
		return fmt.Errorf("agent: writing slot states: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("agent: writing slot states: %w", err)
	}
	if err := a.cfg.FS.Rename(tmp, path); err != nil {
		return fmt.Errorf("agent: writing slot states: %w", err)
	}
	return nil
}

func (a *Agent) shardOf(r *rankState, s *slot) *shardInfo {
	return &shardInfo{
		Job: r.job, Rank: r.rank, Slot: s.Index, State: s.State, Step: s.Step, Seq: s.Seq,
		Size: s.Size, WorldSize: s.WorldSize, Tensors: s.Tensors, HeaderSum: s.HeaderSum,
		CommittedAt: time.Unix(0, s.CommittedAt), Verified: s.verified, Problem: s.Problem,
		Path: a.paths.Segment(r.job, r.rank, s.Index), Epoch: s.Epoch, Leaves: s.leaves,
	}
}

// tensorLeaves are the leaf hashes of a verified shard's tensors, in its
// header's order; immutable once made.
type tensorLeaves struct {
	names  []string
	hashes [][]uint64
}

func (l *tensorLeaves) proto() []*agentpb.TensorLeaves {
	if l == nil {
		return nil
	}
	out := make([]*agentpb.TensorLeaves, len(l.names))
	for i, n := range l.names {
		out[i] = &agentpb.TensorLeaves{Tensor: n, Hashes: l.hashes[i]}
	}
	return out
}

// shardInfo is a consistent snapshot of one slot, safe to use unlocked.
type shardInfo struct {
	Job         string
	Rank        uint32
	Slot        uint32
	State       slotState
	Step        int64
	Seq         uint64
	Size        int64
	WorldSize   uint32
	Tensors     uint32
	HeaderSum   string
	CommittedAt time.Time
	Verified    bool
	Problem     string
	Path        string
	Epoch       uint64
	Leaves      *tensorLeaves
}

// readHeader decodes the header of the segment at path.
func (a *Agent) readHeader(path string) (*shm.Header, []byte, error) {
	f, err := a.cfg.FS.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	return shm.ReadHeader(f, fi.Size())
}

// rankList returns the ranks the agent holds, of job or of every job
// (""), for a caller to lock one at a time.
func (a *Agent) rankList(job string) []*lockedRank {
	a.mu.Lock()
	defer a.mu.Unlock()
	ranks := make([]*lockedRank, 0, len(a.ranks))
	for k, r := range a.ranks {
		if job == "" || k.job == job {
			ranks = append(ranks, r)
		}
	}
	return ranks
}
