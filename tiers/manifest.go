package tiers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"rewind.dev/rewind/shm"
)

// Object names on a tier:
//
//	<job>/step-<step %020d>/rank-<rank %06d>.safetensors   a shard, the bytes it had in shared memory
//	<job>/step-<step %020d>/rank-<rank %06d>.leaves        its leaf hashes, for ranged reads (leaves.go)
//	<job>/step-<step %020d>/manifest.json                  written last: the copy exists once it does
//
// Zero-padded numbers keep a listing in step and rank order.

// ShardName is the object name of one rank's shard of a step.
func ShardName(job string, step int64, rank uint32) string {
	return fmt.Sprintf("%s/step-%020d/rank-%06d.safetensors", job, step, rank)
}

// ManifestName is the object name of a step's manifest.
func ManifestName(job string, step int64) string {
	return fmt.Sprintf("%s/step-%020d/manifest.json", job, step)
}

// Manifest describes a step's copy on one tier.
type Manifest struct {
	Job       string       `json:"job"`
	Step      int64        `json:"step"`
	WorldSize uint32       `json:"world_size"`
	Shards    []ShardEntry `json:"shards"` // one per rank, in rank order
	// Here lists the ranks whose shards this store holds, when it holds
	// only some: a node-local tier (NVMe) holds the shards of the ranks
	// that ran on its node, and its manifest still describes the whole
	// step. Empty means every rank.
	Here      []uint32  `json:"ranks_here,omitempty"`
	WrittenAt time.Time `json:"written_at"`
}

// Holds reports whether the store the manifest was read from holds rank's
// shard.
func (m *Manifest) Holds(rank uint32) bool {
	if int(rank) >= len(m.Shards) {
		return false
	}
	return len(m.Here) == 0 || slices.Contains(m.Here, rank)
}

// held returns the entries of the shards the store holds.
func (m *Manifest) held() []ShardEntry {
	if len(m.Here) == 0 {
		return m.Shards
	}
	out := make([]ShardEntry, 0, len(m.Here))
	for _, r := range m.Here {
		out = append(out, m.Shards[r])
	}
	return out
}

// ShardEntry is one rank's shard in a manifest.
type ShardEntry struct {
	Rank           uint32 `json:"rank"`
	Size           int64  `json:"size"`
	HeaderChecksum string `json:"header_checksum"`
}

// Validate checks a manifest names every rank once, in order.
func (m *Manifest) Validate() error {
	if err := shm.ValidateJob(m.Job); err != nil {
		return fmt.Errorf("tiers: manifest: %w", err)
	}
	if m.Step < 0 || m.WorldSize == 0 || len(m.Shards) != int(m.WorldSize) {
		return fmt.Errorf("tiers: manifest of %s step %d: %d shards for world size %d", m.Job, m.Step, len(m.Shards), m.WorldSize)
	}
	for i, s := range m.Shards {
		if s.Rank != uint32(i) || s.Size < 8 || len(s.HeaderChecksum) != 16 {
			return fmt.Errorf("tiers: manifest of %s step %d: bad entry %d: %+v", m.Job, m.Step, i, s)
		}
	}
	for i, r := range m.Here {
		if r >= m.WorldSize || i > 0 && r <= m.Here[i-1] {
			return fmt.Errorf("tiers: manifest of %s step %d: ranks here %v: not increasing ranks below %d", m.Job, m.Step, m.Here, m.WorldSize)
		}
	}
	return nil
}

// WriteManifest makes a step's copy exist on a tier. It first checks that
// every shard the manifest says the store holds is there with its size, so
// a manifest never points at a missing or partial shard.
func WriteManifest(ctx context.Context, st Store, m *Manifest) error {
	if err := m.Validate(); err != nil {
		return err
	}
	for _, s := range m.held() {
		n, err := st.Size(ctx, ShardName(m.Job, m.Step, s.Rank))
		if err != nil {
			return fmt.Errorf("tiers: %s: manifest of %s step %d: shard of rank %d: %w", st, m.Job, m.Step, s.Rank, err)
		}
		if n != s.Size {
			return fmt.Errorf("tiers: %s: manifest of %s step %d: shard of rank %d is %d bytes, %d expected", st, m.Job, m.Step, s.Rank, n, s.Size)
		}
	}
	if m.WrittenAt.IsZero() {
		m.WrittenAt = time.Now().UTC()
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return st.Put(ctx, ManifestName(m.Job, m.Step), bytes.NewReader(b), int64(len(b)))
}

// maxManifestBytes bounds a manifest read (a million ranks is ~100 MB).
const maxManifestBytes = 256 << 20

// ReadManifest reads and validates a step's manifest; IsNotExist(err) means
// the step has no copy on this tier.
func ReadManifest(ctx context.Context, st Store, job string, step int64) (*Manifest, error) {
	name := ManifestName(job, step)
	n, err := st.Size(ctx, name)
	if err != nil {
		return nil, err
	}
	if n > maxManifestBytes {
		return nil, fmt.Errorf("%w: tiers: %s: manifest %s is %d bytes", shm.ErrCorrupt, st, name, n)
	}
	buf := &memWriter{b: make([]byte, n)}
	if _, err := st.Get(ctx, name, buf); err != nil {
		return nil, err
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(buf.b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: tiers: %s: manifest %s: %v", shm.ErrCorrupt, st, name, err)
	}
	if m.Job != job || m.Step != step {
		return nil, fmt.Errorf("%w: tiers: %s: manifest %s describes %s step %d", shm.ErrCorrupt, st, name, m.Job, m.Step)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", shm.ErrCorrupt, err)
	}
	return &m, nil
}

// Steps lists the steps of a job that have a manifest on the tier, oldest
// first.
func Steps(ctx context.Context, st Store, job string) ([]int64, error) {
	names, err := st.List(ctx, job+"/step-")
	if err != nil {
		return nil, err
	}
	var out []int64
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, job+"/step-")
		num, isManifest := strings.CutSuffix(rest, "/manifest.json")
		if !ok || !isManifest {
			continue
		}
		if s, err := strconv.ParseInt(num, 10, 64); err == nil {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out, nil
}

// GetShard reads one rank's shard of a step into dst, which must be
// exactly the shard's size (a segment mapped for the restore), and checks
// it against the manifest and its own checksums. A mismatch is an error
// wrapping shm.ErrCorrupt: the caller falls back to another copy.
func GetShard(ctx context.Context, st Store, m *Manifest, rank uint32, dst []byte, workers int) error {
	if int(rank) >= len(m.Shards) {
		return fmt.Errorf("tiers: %s: rank %d out of range for %s step %d", st, rank, m.Job, m.Step)
	}
	if !m.Holds(rank) {
		return fmt.Errorf("tiers: %s: %s step %d: the shard of rank %d is on another node's store: %w", st, m.Job, m.Step, rank, ErrNotExist)
	}
	e := m.Shards[rank]
	if int64(len(dst)) != e.Size {
		return fmt.Errorf("tiers: %s: destination is %d bytes, shard of rank %d is %d", st, len(dst), rank, e.Size)
	}
	n, err := st.Get(ctx, ShardName(m.Job, m.Step, rank), &memWriter{b: dst})
	if past := (*pastDestError)(nil); errors.As(err, &past) {
		// The object is larger than the manifest says: one of them lies.
		return fmt.Errorf("%w: tiers: %s: shard of %s step %d rank %d is larger than the %d bytes its manifest says (%v)",
			shm.ErrCorrupt, st, m.Job, m.Step, rank, e.Size, err)
	}
	if err != nil {
		return err
	}
	if n != e.Size {
		return fmt.Errorf("%w: tiers: %s: shard of %s step %d rank %d is %d bytes, manifest says %d", shm.ErrCorrupt, st, m.Job, m.Step, rank, n, e.Size)
	}
	h, err := shm.DecodeBytes(dst)
	if err != nil {
		return fmt.Errorf("tiers: %s: %s step %d rank %d: %w", st, m.Job, m.Step, rank, err)
	}
	if sum := shm.HeaderSum(dst[:h.DataStart]); sum != e.HeaderChecksum {
		return fmt.Errorf("%w: tiers: %s: %s step %d rank %d: header checksum %s, manifest says %s", shm.ErrCorrupt, st, m.Job, m.Step, rank, sum, e.HeaderChecksum)
	}
	if !h.Rewind || h.Meta.Job != m.Job || h.Meta.Step != m.Step || h.Meta.Rank != rank {
		return fmt.Errorf("%w: tiers: %s: shard named %s step %d rank %d holds %s step %d rank %d", shm.ErrCorrupt, st, m.Job, m.Step, rank, h.Meta.Job, h.Meta.Step, h.Meta.Rank)
	}
	if err := h.Verify(dst, workers); err != nil {
		return fmt.Errorf("tiers: %s: %w", st, err)
	}
	return nil
}

// memWriter is an io.WriterAt over fixed memory.
type memWriter struct{ b []byte }

func (w *memWriter) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(w.b)) {
		return 0, &pastDestError{n: int64(len(p)), off: off, size: len(w.b)}
	}
	return copy(w.b[off:], p), nil
}

// pastDestError is a write past the end of a memWriter: what is read is
// larger than its reader was told. It is a short write.
type pastDestError struct {
	n, off int64
	size   int
}

func (e *pastDestError) Error() string {
	return fmt.Sprintf("tiers: write of %d bytes at %d past a %d-byte destination: %v", e.n, e.off, e.size, io.ErrShortWrite)
}

func (e *pastDestError) Unwrap() error { return io.ErrShortWrite }
