package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"rewind.dev/rewind/api/agentpb"
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
	token    uint64 // owner of a writing slot
	readers  int    // open leases and streams
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
// save, also a step newer than the consistent one: pinSet.newer) or being
// read. Preference: an unused slot of the right size (warm), any unused
// slot, a new slot while fewer than max exist, the oldest committed slot
// that is not the latest, then a new slot beside those being read.
func (r *rankState) pick(size int64, max int, pins pinSet, replica bool) *slot {
	latest := r.latest()
	if replica {
		latest = nil // see pickSlot
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
		if s.readers > 0 || s.State == stateStaged {
			held++
		}
		if s == latest || s.readers > 0 || s.State == stateStaged ||
			s.State == stateCommitted && (pinned[s.Step] == s || !replica && pins.unconfirmed(s.Step)) {
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
	// A slot being read (a tier transfer, a peer's restore) or staged by a
	// restore does not count against max: rather than wait for the reader
	// or the restore, the save gets one more
	// segment, so reading a checkpoint never stalls training. The extra
	// segment stays and joins the rotation; the budget still bounds it.
	if len(r.slots)-held < max {
		return r.newSlot()
	}
	return nil
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
		Path: a.paths.Segment(r.job, r.rank, s.Index), Epoch: s.Epoch,
	}
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
