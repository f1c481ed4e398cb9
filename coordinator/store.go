package coordinator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// Store persists the index in pebble. Key schema (docs/design/20261121_coordinator_store.md):
//
//	job/<job>                                      -> jobRecord
//	node/<node>                                    -> NodeInfo
//	step/<job>/<step %020d>                        -> stepRecord
//	copy/<job>/<step %020d>/<rank %010d>/<tier>/<node> -> "<size> <checksum> <state>"
//	audit/<unix nanos %020d>/<seq %020d>           -> auditRecord (audit.go; not the index)
//
// Job ids cannot contain '/' (shm.ValidateJob), and the node name is the
// last element, so keys parse unambiguously and sort by job, then step.
//
// Writes that do not decide a state (a copy recorded, a partial step) are
// grouped: they collect in a pending batch that the next deciding write
// commits with them, synced, or that Flush commits unsynced. Losing them in
// a crash loses nothing: agents resend their inventory on reconnection.
// Callers serialize Write and Flush.
type Store struct {
	db      *pebble.DB
	pending *pebble.Batch
	key     []byte // scratch for copy keys and values: the batch copies them
	val     []byte
}

// maxPending bounds the grouped, unsynced writes before they are committed.
const maxPending = 4096

type jobRecord struct {
	WorldSize uint32            `json:"world_size"`
	Placement map[uint32]string `json:"placement,omitempty"`
	Latest    int64             `json:"latest"`
	Epoch     uint64            `json:"epoch,omitempty"`
	Epochs    []EpochStart      `json:"epochs,omitempty"`
}

type stepRecord struct {
	WorldSize    uint32        `json:"world_size"`
	State        StepState     `json:"state"`
	ConsistentAt time.Time     `json:"consistent_at,omitzero"`
	Unrestorable *Unrestorable `json:"unrestorable,omitempty"`
	Epoch        uint64        `json:"epoch,omitempty"`
}

// OpenStore opens (or creates) the store in dir.
func OpenStore(dir string, log *slog.Logger) (*Store, error) {
	db, err := pebble.Open(dir, &pebble.Options{
		Logger: pebbleLogger{log},
		// Copies churn: each is written when a rank commits and deleted
		// when its slot is reused a few steps later; a memtable that
		// holds a few steps lets most of them be written and deleted
		// before a flush, which then keeps only the deletion. Inserts
		// are most of a commit's time under the index lock, and their
		// cost grows with the memtable: each walks a skiplist that
		// outgrows the CPU caches. 8 MiB holds about five steps of an
		// 8,192-rank job and inserts at half the cost of 64 MiB's
		// (docs/performance.md); the default 4 MiB flushes every three.
		MemTableSize: 8 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("coordinator: opening store %s: %w", dir, err)
	}
	return &Store{db: db}, nil
}

// pebbleLogger sends pebble's messages to slog: routine ones at debug.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any)  { p.l.Debug(fmt.Sprintf(format, args...)) }
func (p pebbleLogger) Errorf(format string, args ...any) { p.l.Error(fmt.Sprintf(format, args...)) }
func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...))
	os.Exit(1)
}

// Close commits grouped writes and closes the store.
func (s *Store) Close() error {
	return errors.Join(s.Flush(), s.db.Close())
}

func jobKey(job string) []byte { return []byte("job/" + job) }
func stepKey(job string, step int64) []byte {
	return fmt.Appendf(nil, "step/%s/%020d", job, step)
}
func copyKey(k CopyKey) []byte { return appendCopyKey(nil, k) }

func appendCopyKey(b []byte, k CopyKey) []byte {
	b = append(append(b, "copy/"...), k.Job...)
	b = appendPadded(append(b, '/'), uint64(k.Step), 20)
	b = appendPadded(append(b, '/'), uint64(k.Rank), 10)
	return append(append(append(append(b, '/'), k.Tier...), '/'), k.Node...)
}

// appendPadded appends v in decimal, zero-padded to width digits, as
// fmt's %0*d does for the non-negative numbers of keys.
func appendPadded(b []byte, v uint64, width int) []byte {
	var d [20]byte
	digits := strconv.AppendUint(d[:0], v, 10)
	for range width - len(digits) {
		b = append(b, '0')
	}
	return append(b, digits...)
}
func nodeKey(name string) []byte { return []byte("node/" + name) }

// Write persists ch. A change with Sync set is committed synced, together
// with every grouped write before it, before Write returns; other changes
// are grouped (see Store).
func (s *Store) Write(ch *Changes) error {
	if s.pending == nil {
		s.pending = s.db.NewBatch()
	}
	b := s.pending
	put := func(k []byte, v any) error {
		data, err := json.Marshal(v)
		if err != nil {
			return err
		}
		return b.Set(k, data, nil)
	}
	// Dropped steps first: a step dropped and re-created by the same
	// change must end with its new record.
	for _, k := range ch.Dropped {
		if err := b.Delete(stepKey(k.Job, k.Step), nil); err != nil {
			return err
		}
	}
	for _, j := range ch.Jobs {
		if err := put(jobKey(j.ID), jobRecord{WorldSize: j.WorldSize, Placement: j.Placement, Latest: j.Latest,
			Epoch: j.Epoch, Epochs: j.Epochs}); err != nil {
			return err
		}
	}
	for _, st := range ch.Steps {
		if err := put(stepKey(st.Job, st.Step), stepRecord{WorldSize: st.WorldSize, State: st.State, ConsistentAt: st.ConsistentAt,
			Unrestorable: st.Unrestorable, Epoch: st.Epoch}); err != nil {
			return err
		}
	}
	for _, c := range ch.Copies {
		var err error
		if c.Copy == nil {
			s.key = appendCopyKey(s.key[:0], c)
			err = b.Delete(s.key, nil)
		} else {
			s.key, s.val = appendCopyKey(s.key[:0], c), appendCopy(s.val[:0], c.Copy)
			err = b.Set(s.key, s.val, nil)
		}
		if err != nil {
			return err
		}
	}
	if ch.Sync || b.Count() >= maxPending {
		return s.commit(ch.Sync)
	}
	return nil
}

// Flush commits the grouped writes, unsynced.
func (s *Store) Flush() error { return s.commit(false) }

// Discard drops the grouped writes not committed yet.
func (s *Store) Discard() {
	if s.pending != nil {
		s.pending.Close()
		s.pending = nil
	}
}

func (s *Store) commit(sync bool) error {
	b := s.pending
	if b == nil || b.Empty() && !sync {
		return nil
	}
	s.pending = nil
	defer b.Close()
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
	}
	if err := b.Commit(opts); err != nil {
		return fmt.Errorf("coordinator: writing index: %w", err)
	}
	return nil
}

// PutNode records a registered agent.
func (s *Store) PutNode(n *NodeInfo) error {
	data, err := json.Marshal(n)
	if err != nil {
		return err
	}
	return s.db.Set(nodeKey(n.Name), data, pebble.Sync)
}

// Load reads the whole index into st.
func (s *Store) Load(st *State) error {
	it, err := s.db.NewIter(nil)
	if err != nil {
		return err
	}
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		if bytes.HasPrefix(it.Key(), []byte(auditPrefix)) { // the audit log is not the index
			if valid = it.SeekGE([]byte(auditEnd)); !valid {
				break
			}
		}
		if err := st.loadKey(string(it.Key()), it.Value()); err != nil {
			return fmt.Errorf("coordinator: loading key %q: %w", it.Key(), err)
		}
	}
	for _, j := range st.Jobs {
		for _, n := range j.Placement {
			st.noteNode(n, j.ID)
		}
		for _, stp := range j.Steps {
			for _, m := range []map[uint32][]*Copy{stp.Copies, stp.Bad} {
				for _, cs := range m {
					for _, c := range cs {
						st.noteNode(c.Node, j.ID)
					}
				}
			}
			stp.safe = 0
			for _, cs := range stp.Copies {
				stp.noteSafe(false, survives(cs))
			}
			if stp.WorldSize != j.WorldSize {
				continue
			}
			for r := range stp.Copies {
				if l, ok := j.rankLatest[r]; !ok || stp.Step > l {
					j.rankLatest[r] = stp.Step
				}
			}
		}
		j.updateProtected()
	}
	return it.Error()
}

func (st *State) loadKey(key string, val []byte) error {
	kind, rest, _ := strings.Cut(key, "/")
	switch kind {
	case "job":
		var r jobRecord
		if err := json.Unmarshal(val, &r); err != nil {
			return err
		}
		j := st.job(rest)
		j.WorldSize, j.Latest, j.Epoch, j.Epochs = r.WorldSize, r.Latest, r.Epoch, r.Epochs
		if r.Placement != nil {
			j.Placement = r.Placement
		}
	case "node":
		var n NodeInfo
		if err := json.Unmarshal(val, &n); err != nil {
			return err
		}
		st.Nodes[n.Name] = &n
	case "step":
		job, s, _ := strings.Cut(rest, "/")
		step, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return err
		}
		var r stepRecord
		if err := json.Unmarshal(val, &r); err != nil {
			return err
		}
		stp := st.step(job, step)
		stp.WorldSize, stp.State, stp.ConsistentAt, stp.Unrestorable, stp.Epoch = r.WorldSize, r.State, r.ConsistentAt, r.Unrestorable, r.Epoch
	case "copy":
		parts := strings.SplitN(rest, "/", 5)
		if len(parts) != 5 {
			return fmt.Errorf("malformed copy key")
		}
		step, err1 := strconv.ParseInt(parts[1], 10, 64)
		rank, err2 := strconv.ParseUint(parts[2], 10, 32)
		c, err3 := decodeCopy(val)
		if err := errors.Join(err1, err2, err3); err != nil {
			return err
		}
		c.Rank, c.Tier, c.Node = uint32(rank), parts[3], parts[4]
		stp := st.step(parts[0], step)
		if c.State == CopyCorrupt {
			stp.addBad(c)
			break
		}
		stp.Copies[c.Rank] = append(stp.Copies[c.Rank], c)
	}
	return nil
}

// job returns the job, creating an empty record while loading.
func (st *State) job(id string) *Job {
	j := st.Jobs[id]
	if j == nil {
		j = &Job{ID: id, Placement: map[uint32]string{}, Latest: -1, Protected: -1, Steps: map[int64]*Step{}, rankLatest: map[uint32]int64{}}
		st.Jobs[id] = j
	}
	return j
}

func (st *State) step(job string, step int64) *Step {
	j := st.job(job)
	s := j.Steps[step]
	if s == nil {
		s = &Step{Job: job, Step: step, State: Partial, Copies: map[uint32][]*Copy{}}
		j.Steps[step] = s
	}
	return s
}

// encodeCopy writes a copy's value: "<size> <checksum> <state>". Rank, tier
// and node are in the key. Copies are the bulk of the index, so they skip
// JSON.
func encodeCopy(c *Copy) []byte { return appendCopy(nil, c) }

func appendCopy(b []byte, c *Copy) []byte {
	b = strconv.AppendUint(b, c.Size, 10)
	return append(append(append(append(b, ' '), c.Sum...), ' '), c.State...)
}

func decodeCopy(v []byte) (*Copy, error) {
	f := strings.SplitN(string(v), " ", 3)
	if len(f) != 3 {
		return nil, fmt.Errorf("malformed copy value %q", v)
	}
	size, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return nil, err
	}
	return &Copy{Size: size, Sum: f[1], State: CopyState(f[2])}, nil
}
