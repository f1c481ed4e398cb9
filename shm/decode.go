package shm

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Header is a decoded shard header.
type Header struct {
	// Meta is zero for a safetensors file not written by rewind.
	Meta      ShardMeta
	Rewind    bool     // the file carries rewind metadata
	Tensors   []Tensor // sorted by data offset
	Metadata  map[string]string
	Objects   []byte // JSON of the non-tensor state, or nil
	HeaderLen int64  // length of the JSON header, padding included
	DataStart int64
	Size      int64 // total file size
}

// Tensor returns the tensor with the given name, or nil. It scans the
// tensors: a caller looking up every name indexes them instead.
func (h *Header) Tensor(name string) *Tensor {
	for i := range h.Tensors {
		if h.Tensors[i].Name == name {
			return &h.Tensors[i]
		}
	}
	return nil
}

// DecodeBytes decodes the header of the shard held in b (for example a
// mapped segment); len(b) is the file size.
func DecodeBytes(b []byte) (*Header, error) {
	return Decode(bytes.NewReader(b), int64(len(b)))
}

// Decode reads and validates the header of a safetensors file of the given
// size: every tensor has a known dtype, its offsets match its shape, and the
// tensors cover the data section exactly, without holes or overlaps. Rewind
// metadata, when present, must be complete and consistent.
func Decode(r io.ReaderAt, size int64) (*Header, error) {
	h, _, err := ReadHeader(r, size)
	return h, err
}

// ReadHeader is Decode that also returns the header's bytes as they are
// in the file (length prefix and padding included, DataStart bytes), read
// once, for a caller that checksums them (HeaderSum).
func ReadHeader(r io.ReaderAt, size int64) (*Header, []byte, error) {
	var lenb [8]byte
	if size < 8 {
		return nil, nil, fmt.Errorf("%w: file is %d bytes, shorter than the 8-byte header length", ErrCorrupt, size)
	}
	if _, err := r.ReadAt(lenb[:], 0); err != nil {
		return nil, nil, fmt.Errorf("shm: reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenb[:])
	if n < 2 || n > MaxHeaderBytes || int64(n) > size-8 {
		return nil, nil, fmt.Errorf("%w: header length %d invalid for a %d-byte file", ErrCorrupt, n, size)
	}
	raw := make([]byte, 8+n)
	copy(raw, lenb[:])
	if _, err := r.ReadAt(raw[8:], 8); err != nil {
		return nil, nil, fmt.Errorf("shm: reading %d-byte header: %w", n, err)
	}
	h := &Header{HeaderLen: int64(n), DataStart: 8 + int64(n), Size: size}
	if err := h.parse(raw[8:]); err != nil {
		return nil, nil, err
	}
	return h, raw, nil
}

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}

func (h *Header) parse(raw []byte) error {
	if len(raw) == 0 || raw[0] != '{' {
		return corruptf("header does not start with '{'")
	}
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&top); err != nil {
		return corruptf("header is not a JSON object: %v", err)
	}
	if rest := bytes.TrimLeft(raw[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return corruptf("%d bytes of garbage after the JSON header", len(rest))
	}
	if m, ok := top["__metadata__"]; ok {
		if err := json.Unmarshal(m, &h.Metadata); err != nil {
			return corruptf("__metadata__ is not a string-to-string map: %v", err)
		}
		delete(top, "__metadata__")
	}
	for name, v := range top {
		var jt jsonTensor
		if err := json.Unmarshal(v, &jt); err != nil {
			return corruptf("tensor %q: %v", name, err)
		}
		if !jt.DType.Valid() {
			return corruptf("tensor %q: unknown dtype %q", name, string(jt.DType))
		}
		if len(jt.DataOffsets) != 2 {
			return corruptf("tensor %q: data_offsets must have two entries, has %d", name, len(jt.DataOffsets))
		}
		want, err := jt.DType.NumBytes(jt.Shape)
		if err != nil {
			return corruptf("tensor %q: %v", name, err)
		}
		b, e := jt.DataOffsets[0], jt.DataOffsets[1]
		if b < 0 || e < b || e-b != want {
			return corruptf("tensor %q: offsets [%d,%d] do not fit %s%v (%d bytes)", name, b, e, jt.DType, jt.Shape, want)
		}
		h.Tensors = append(h.Tensors, Tensor{TensorSpec: TensorSpec{Name: name, DType: jt.DType, Shape: jt.Shape}, Begin: b, End: e})
	}
	slices.SortFunc(h.Tensors, func(a, b Tensor) int {
		return cmp.Or(cmp.Compare(a.Begin, b.Begin), cmp.Compare(a.End, b.End), strings.Compare(a.Name, b.Name))
	})
	var off int64
	for _, t := range h.Tensors {
		if t.Begin != off {
			return corruptf("tensor %q starts at %d, expected %d (hole or overlap)", t.Name, t.Begin, off)
		}
		off = t.End
	}
	if dataLen := h.Size - h.DataStart; off != dataLen {
		return corruptf("tensors cover %d bytes of a %d-byte data section", off, dataLen)
	}
	return h.parseRewind()
}

// parseRewind reads rewind's own metadata keys, if the file has them.
func (h *Header) parseRewind() error {
	md := h.Metadata
	if md[MetaFormat] == "" {
		return nil
	}
	if md[MetaFormat] != FormatVersion {
		return corruptf("unsupported %s %q", MetaFormat, md[MetaFormat])
	}
	h.Rewind = true
	h.Meta.Job = md[MetaJob]
	if err := ValidateJob(h.Meta.Job); err != nil {
		return corruptf("%v", err)
	}
	rank, err1 := strconv.ParseUint(md[MetaRank], 10, 32)
	ws, err2 := strconv.ParseUint(md[MetaWorldSize], 10, 32)
	step, err3 := strconv.ParseInt(md[MetaStep], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || ws == 0 || rank >= ws || step < 0 {
		return corruptf("bad rank/world size/step %q/%q/%q", md[MetaRank], md[MetaWorldSize], md[MetaStep])
	}
	h.Meta.Rank, h.Meta.WorldSize, h.Meta.Step = uint32(rank), uint32(ws), step
	if md[MetaAlgo] != ChecksumAlgo {
		return corruptf("unknown checksum %q", md[MetaAlgo])
	}
	if o, ok := md[MetaObjects]; ok {
		if !json.Valid([]byte(o)) {
			return corruptf("%s is not valid JSON", MetaObjects)
		}
		h.Objects = []byte(o)
	}
	// By name, once: a shard of an optimizer's state holds 100,000
	// tensors and more, and a scan per name made this quadratic.
	byName := make(map[string]*Tensor, len(h.Tensors))
	for i := range h.Tensors {
		byName[h.Tensors[i].Name] = &h.Tensors[i]
	}
	if c, ok := md[MetaChunks]; ok {
		var chunks map[string]*Chunk
		if err := json.Unmarshal([]byte(c), &chunks); err != nil {
			return corruptf("%s: %v", MetaChunks, err)
		}
		for name, ch := range chunks {
			t := byName[name]
			if t == nil {
				return corruptf("chunk for unknown tensor %q", name)
			}
			if ch == nil {
				continue
			}
			if err := checkChunk(ch, t.Shape); err != nil {
				return corruptf("tensor %q: %v", name, err)
			}
			t.Chunk = ch
		}
	}
	for i := range h.Tensors {
		t := &h.Tensors[i]
		s := md[MetaSumPrefix+t.Name]
		v, err := strconv.ParseUint(s, 16, 64)
		if len(s) != 16 || err != nil {
			return corruptf("tensor %q: checksum %q missing or malformed", t.Name, s)
		}
		t.Sum, t.HasSum = v, true
	}
	for k := range md {
		if name, ok := strings.CutPrefix(k, MetaSumPrefix); ok && byName[name] == nil {
			return corruptf("checksum for unknown tensor %q", name)
		}
	}
	return nil
}

// Verify checks every tensor checksum of the shard held in b against the
// header, spreading the work over workers goroutines. It returns an error
// wrapping ErrCorrupt naming the first tensor that does not match.
func (h *Header) Verify(b []byte, workers int) error {
	if int64(len(b)) != h.Size {
		return corruptf("file is %d bytes, header says %d", len(b), h.Size)
	}
	copies := make([]Copy, len(h.Tensors))
	for i, t := range h.Tensors {
		copies[i].Src = b[h.DataStart+t.Begin : h.DataStart+t.End]
	}
	return h.check(CopyAndSum(copies, workers))
}

// VerifyAt is Verify of the shard in r, h.Size bytes, read with ReadAt
// rather than mapped (SumAt). An error reading r does not wrap
// ErrCorrupt.
func (h *Header) VerifyAt(r io.ReaderAt, workers int) error {
	_, err := h.VerifyAtLeaves(r, workers)
	return err
}

// VerifyAtLeaves is VerifyAt that returns, when every tensor matches, the
// leaf hashes of each tensor in h.Tensors order (VerifyRange's leaves).
func (h *Header) VerifyAtLeaves(r io.ReaderAt, workers int) ([][]uint64, error) {
	secs := make([]Section, len(h.Tensors))
	for i, t := range h.Tensors {
		secs[i] = Section{Off: h.DataStart + t.Begin, Len: t.Len()}
	}
	leaves, err := LeavesAt(r, secs, workers)
	if err != nil {
		return nil, err
	}
	if err := h.check(roots(leaves)); err != nil {
		return nil, err
	}
	return leaves, nil
}

// check compares computed sums, in h.Tensors order, with the recorded ones.
func (h *Header) check(sums []uint64) error {
	for i, t := range h.Tensors {
		if !t.HasSum {
			return corruptf("tensor %q has no checksum", t.Name)
		}
		if sums[i] != t.Sum {
			return corruptf("tensor %q (step %d, rank %d): checksum %s, header says %s",
				t.Name, h.Meta.Step, h.Meta.Rank, FormatSum(sums[i]), FormatSum(t.Sum))
		}
	}
	return nil
}

// CopyOut copies every tensor of the shard held in b into the matching
// buffer of dst (same order as h.Tensors, each of the tensor's length) and
// verifies the checksums in the same pass.
func (h *Header) CopyOut(b []byte, dst [][]byte, workers int) error {
	if int64(len(b)) != h.Size {
		return corruptf("file is %d bytes, header says %d", len(b), h.Size)
	}
	copies := make([]Copy, len(h.Tensors))
	for i, t := range h.Tensors {
		copies[i] = Copy{Dst: dst[i], Src: b[h.DataStart+t.Begin : h.DataStart+t.End]}
	}
	return h.check(CopyAndSum(copies, workers))
}
