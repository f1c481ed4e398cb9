package tiers

// Ranged reads of a tier copy. A rank restoring at another world size
// reads parts of old ranks' shards; where only a tier holds them, reading
// every byte of each shard would move the whole checkpoint to every new
// rank. A shard's 1 MiB leaves can be checked one by one against their
// hashes, but a tier copy holds only the header's per-tensor checksums
// (each the root of its leaves' hashes): so beside each shard the agent
// that pushes it writes its leaf hashes,
//
//	<job>/step-<step %020d>/rank-<rank %06d>.leaves
//
// which a reader checks against the header's checksums (the header itself
// against the checksum the coordinator and the manifest recorded) before
// it trusts any of them. A copy without one (pushed before it existed, or
// its write failed) is read whole.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/minio/minio-go/v7"
	"rewind.dev/rewind/shm"
)

// LeavesName is the object name of one rank's shard's leaf hashes.
func LeavesName(job string, step int64, rank uint32) string {
	return fmt.Sprintf("%s/step-%020d/rank-%06d.leaves", job, step, rank)
}

// leavesMagic starts a leaves object: the format's name and version.
const leavesMagic = "RWLEAF01"

// EncodeLeaves is the leaves object of a shard: the magic, the tensor
// count, then each tensor's leaf count and hashes, little-endian, in the
// header's tensor order.
func EncodeLeaves(leaves [][]uint64) []byte {
	n := len(leavesMagic) + 4
	for _, l := range leaves {
		n += 4 + 8*len(l)
	}
	b := make([]byte, 0, n)
	b = append(b, leavesMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(leaves)))
	for _, l := range leaves {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(l)))
		for _, h := range l {
			b = binary.LittleEndian.AppendUint64(b, h)
		}
	}
	return b
}

// DecodeLeaves parses a leaves object and checks it against h, the
// shard's header (already checked): one list per tensor, as many hashes
// as the tensor has leaves, making the tensor's checksum. Anything else
// is an error wrapping shm.ErrCorrupt.
func DecodeLeaves(b []byte, h *shm.Header) ([][]uint64, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: tiers: leaf hashes: %s", shm.ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if len(b) < len(leavesMagic)+4 || string(b[:len(leavesMagic)]) != leavesMagic {
		return nil, bad("no %s magic in %d bytes", leavesMagic, len(b))
	}
	b = b[len(leavesMagic):]
	if n := binary.LittleEndian.Uint32(b); int(n) != len(h.Tensors) {
		return nil, bad("%d tensors, the header has %d", n, len(h.Tensors))
	}
	b = b[4:]
	out := make([][]uint64, len(h.Tensors))
	for i, t := range h.Tensors {
		want := shm.NumLeaves(t.Len())
		if len(b) < 4 || int(binary.LittleEndian.Uint32(b)) != want {
			return nil, bad("tensor %q: not %d leaf hashes", t.Name, want)
		}
		b = b[4:]
		if len(b) < 8*want {
			return nil, bad("tensor %q: %d bytes for %d leaf hashes", t.Name, len(b), want)
		}
		out[i] = make([]uint64, want)
		for j := range out[i] {
			out[i][j] = binary.LittleEndian.Uint64(b[8*j:])
		}
		b = b[8*want:]
		if !t.HasSum || shm.RootOf(out[i]) != t.Sum {
			return nil, bad("tensor %q: the hashes do not make its checksum", t.Name)
		}
	}
	if len(b) != 0 {
		return nil, bad("%d bytes past the last tensor's", len(b))
	}
	return out, nil
}

// PutLeaves stores a shard's leaf hashes beside it.
func PutLeaves(ctx context.Context, st Store, job string, step int64, rank uint32, leaves [][]uint64) error {
	b := EncodeLeaves(leaves)
	return st.Put(ctx, LeavesName(job, step, rank), BytesReaderAt(b), int64(len(b)))
}

// GetLeaves reads a shard's leaf hashes and checks them against h; a copy
// without them is an error for which IsNotExist is true.
func GetLeaves(ctx context.Context, st Store, job string, step int64, rank uint32, h *shm.Header) ([][]uint64, error) {
	name := LeavesName(job, step, rank)
	size, err := st.Size(ctx, name)
	if err != nil {
		return nil, err
	}
	limit := int64(len(leavesMagic) + 4)
	for _, t := range h.Tensors {
		limit += 4 + 8*int64(shm.NumLeaves(t.Len()))
	}
	if size != limit {
		return nil, fmt.Errorf("%w: tiers: %s: %s is %d bytes, its shard's tensors make %d", shm.ErrCorrupt, st, name, size, limit)
	}
	b := make([]byte, size)
	n, err := st.Get(ctx, name, &memWriter{b: b})
	if err == nil && n != size {
		err = fmt.Errorf("%w: the object changed size while it was read", shm.ErrCorrupt)
	}
	if err != nil {
		return nil, fmt.Errorf("tiers: %s: reading %s (%d of %d bytes): %w", st, name, n, size, err)
	}
	return DecodeLeaves(b, h)
}

// RangeReader is a Store that reads part of an object.
type RangeReader interface {
	// ReadRange fills dst with the object's bytes from off; an object
	// shorter than off+len(dst) is an error wrapping io.ErrUnexpectedEOF.
	ReadRange(ctx context.Context, name string, off int64, dst []byte) error
}

// ErrNoRange says a store cannot read part of an object.
var ErrNoRange = errors.New("tiers: the store reads whole objects only")

// ReadRange reads part of an object from st, when st is a RangeReader.
func ReadRange(ctx context.Context, st Store, name string, off int64, dst []byte) error {
	rr, ok := st.(RangeReader)
	if !ok {
		return fmt.Errorf("%w (%s)", ErrNoRange, st)
	}
	return rr.ReadRange(ctx, name, off, dst)
}

// ReadRange implements RangeReader.
func (s *FileStore) ReadRange(ctx context.Context, name string, off int64, dst []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	path, err := s.path(name)
	if err != nil {
		return err
	}
	f, err := s.fs.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("tiers: %s: %s: %w", s, name, err)
	}
	defer f.Close()
	if _, err := f.ReadAt(dst, off); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("tiers: %s: reading %d bytes of %s at %d: %w", s, len(dst), name, off, err)
	}
	return nil
}

// ReadRange implements RangeReader: one ranged GET, retried as any
// request is, except when the object is shorter than the range (a 416, or
// a body announced shorter than asked): that is what the object is, not a
// transient failure, and is answered at once.
func (s *S3Store) ReadRange(ctx context.Context, name string, off int64, dst []byte) error {
	key, err := s.key(name)
	if err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	return s.retry(ctx, "get", name, key, func(ctx context.Context) error {
		var opts minio.GetObjectOptions
		if err := opts.SetRange(off, off+int64(len(dst))-1); err != nil {
			return &s3ShortObjectError{err}
		}
		rc, info, _, err := s.core.GetObject(ctx, s.bucket, key, opts)
		if s3Code(err) == "InvalidRange" {
			return &s3ShortObjectError{fmt.Errorf("%w: %d bytes at %d: past the end of the object", io.ErrUnexpectedEOF, len(dst), off)}
		}
		if err != nil {
			return err
		}
		defer rc.Close()
		if info.Size >= 0 && info.Size < int64(len(dst)) {
			return &s3ShortObjectError{fmt.Errorf("%w: %d bytes at %d: the object has %d from there", io.ErrUnexpectedEOF, len(dst), off, info.Size)}
		}
		if _, err := io.ReadFull(rc, dst); err != nil {
			return s3ShortRange(err, off) // the body was cut: retried
		}
		return nil
	})
}
