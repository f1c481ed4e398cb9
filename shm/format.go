package shm

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Alignment of the data section: the header is padded with spaces so that
// tensor data starts on a 4 KiB boundary.
const Alignment = 4096

// FormatVersion is the value of the rewind.format metadata key.
const FormatVersion = "1"

// MaxHeaderBytes bounds the JSON header, as the safetensors reference
// implementation does (100 MB).
const MaxHeaderBytes = 100 << 20

// Metadata keys rewind writes into __metadata__. Every value is a string, as
// safetensors requires; structured values are JSON-encoded strings.
const (
	MetaFormat    = "rewind.format"
	MetaJob       = "rewind.job"
	MetaRank      = "rewind.rank"
	MetaWorldSize = "rewind.world_size"
	MetaStep      = "rewind.step"
	MetaAlgo      = "rewind.checksum"
	MetaObjects   = "rewind.objects" // JSON document of non-tensor state
	MetaChunks    = "rewind.chunks"  // JSON: tensor name -> Chunk
	MetaSumPrefix = "rewind.sum."    // + tensor name -> 16 hex digits
)

// ErrCorrupt marks a shard whose bytes do not match its header or checksums.
var ErrCorrupt = errors.New("shm: shard corrupt")

// Chunk places a tensor that is one piece of a larger, sharded tensor: the
// global shape and this piece's offset in every dimension, so that a restore
// can reshard to another world size.
type Chunk struct {
	GlobalShape []int64 `json:"global_shape"`
	Offsets     []int64 `json:"offsets"`
}

// TensorSpec describes a tensor to be written.
type TensorSpec struct {
	Name  string
	DType DType
	Shape []int64
	Chunk *Chunk // nil unless the tensor is a piece of a sharded tensor
}

// ShardMeta identifies a shard.
type ShardMeta struct {
	Job       string
	Rank      uint32
	WorldSize uint32
	Step      int64
}

// Tensor is a tensor as recorded in a shard header.
type Tensor struct {
	TensorSpec
	Begin, End int64 // byte offsets relative to the start of the data section
	Sum        uint64
	HasSum     bool
}

// Len returns the tensor's size in bytes.
func (t *Tensor) Len() int64 { return t.End - t.Begin }

// Layout is the plan of a shard before its data is written: the header with
// placeholder checksums, and where each tensor goes. Build it with NewLayout,
// copy the data, then SetSum for every tensor and write Header() at offset 0.
type Layout struct {
	Meta      ShardMeta
	Tensors   []Tensor // in data order
	DataStart int64    // offset of the data section in the file
	Size      int64    // total file size
	header    []byte   // 8-byte length + JSON + padding
	sumPos    []int    // offset in header of each tensor's 16 hex digits
}

type jsonTensor struct {
	DType       DType   `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// NewLayout plans a shard. Tensors are placed in the data section ordered by
// decreasing element size (stable otherwise), so every tensor is aligned to
// its element size without holes between tensors, as safetensors requires.
// objects is the JSON document of the non-tensor state, or nil.
func NewLayout(meta ShardMeta, specs []TensorSpec, objects []byte) (*Layout, error) {
	if err := ValidateJob(meta.Job); err != nil {
		return nil, err
	}
	if meta.WorldSize == 0 || meta.Rank >= meta.WorldSize {
		return nil, fmt.Errorf("shm: rank %d out of range for world size %d", meta.Rank, meta.WorldSize)
	}
	if meta.Step < 0 {
		return nil, fmt.Errorf("shm: negative step %d", meta.Step)
	}
	if objects != nil && (!json.Valid(objects) || !utf8.Valid(objects)) {
		return nil, errors.New("shm: non-tensor state is not valid UTF-8 JSON")
	}
	l := &Layout{Meta: meta, Tensors: make([]Tensor, len(specs))}
	seen := make(map[string]bool, len(specs))
	for i, s := range specs {
		if s.Name == "" || s.Name == "__metadata__" {
			return nil, fmt.Errorf("shm: tensor %d: invalid name %q", i, s.Name)
		}
		if !utf8.ValidString(s.Name) {
			return nil, fmt.Errorf("shm: tensor %d: name %q is not valid UTF-8", i, s.Name)
		}
		if s.Chunk != nil {
			if err := checkChunk(s.Chunk, s.Shape); err != nil {
				return nil, fmt.Errorf("shm: tensor %q: %w", s.Name, err)
			}
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("shm: duplicate tensor name %q", s.Name)
		}
		seen[s.Name] = true
		if _, err := s.DType.NumBytes(s.Shape); err != nil {
			return nil, fmt.Errorf("shm: tensor %q: %w", s.Name, err)
		}
		l.Tensors[i].TensorSpec = s
	}
	slices.SortStableFunc(l.Tensors, func(a, b Tensor) int {
		return int(b.DType.Size() - a.DType.Size())
	})
	var off int64
	for i := range l.Tensors {
		t := &l.Tensors[i]
		n, _ := t.DType.NumBytes(t.Shape)
		t.Begin, t.End = off, off+n
		off += n
	}
	l.encodeHeader(objects)
	if l.DataStart-8 > MaxHeaderBytes {
		return nil, fmt.Errorf("shm: header is %d bytes, over the %d-byte limit", l.DataStart-8, MaxHeaderBytes)
	}
	l.Size = l.DataStart + off
	return l, nil
}

// encodeHeader writes the JSON header by hand, so that the position of every
// checksum placeholder is known and SetSum can fill it in place.
func (l *Layout) encodeHeader(objects []byte) {
	b := make([]byte, 8, 512+128*len(l.Tensors))
	str := func(s string) { b, _ = appendJSON(b, s) }
	kv := func(k, v string) { str(k); b = append(b, ':'); str(v); b = append(b, ',') }
	b = append(b, `{"__metadata__":{`...)
	kv(MetaFormat, FormatVersion)
	kv(MetaJob, l.Meta.Job)
	kv(MetaRank, strconv.FormatUint(uint64(l.Meta.Rank), 10))
	kv(MetaWorldSize, strconv.FormatUint(uint64(l.Meta.WorldSize), 10))
	kv(MetaStep, strconv.FormatInt(l.Meta.Step, 10))
	kv(MetaAlgo, ChecksumAlgo)
	if objects != nil {
		kv(MetaObjects, string(objects))
	}
	chunks := map[string]*Chunk{}
	for _, t := range l.Tensors {
		if t.Chunk != nil {
			chunks[t.Name] = t.Chunk
		}
	}
	if len(chunks) > 0 {
		cj, _ := json.Marshal(chunks)
		kv(MetaChunks, string(cj))
	}
	l.sumPos = make([]int, len(l.Tensors))
	for i, t := range l.Tensors {
		str(MetaSumPrefix + t.Name)
		b = append(b, `:"`...)
		l.sumPos[i] = len(b)
		b = append(b, "0000000000000000\","...)
	}
	b = b[:len(b)-1] // drop the last comma
	b = append(b, '}')
	for _, t := range l.Tensors {
		b = append(b, ',')
		str(t.Name)
		b = append(b, ':')
		shape := t.Shape
		if shape == nil {
			shape = []int64{}
		}
		tj, _ := json.Marshal(jsonTensor{DType: t.DType, Shape: shape, DataOffsets: []int64{t.Begin, t.End}})
		b = append(b, tj...)
	}
	b = append(b, '}')
	for len(b)%Alignment != 0 {
		b = append(b, ' ')
	}
	binary.LittleEndian.PutUint64(b, uint64(len(b)-8))
	l.header = b
	l.DataStart = int64(len(b))
}

func appendJSON(b []byte, s string) ([]byte, error) {
	j, err := json.Marshal(s)
	return append(b, j...), err
}

// SetSum records tensor i's checksum in the header.
func (l *Layout) SetSum(i int, sum uint64) {
	l.Tensors[i].Sum, l.Tensors[i].HasSum = sum, true
	copy(l.header[l.sumPos[i]:], FormatSum(sum))
}

// Header returns the encoded header, length prefix and padding included.
// It is valid to write once every SetSum has been called.
func (l *Layout) Header() []byte { return l.header }

// HeaderSum returns the checksum of a shard's header bytes (the file up to
// DataStart). The header carries every tensor checksum, so this one value
// identifies the whole shard's content.
func HeaderSum(raw []byte) string { return FormatSum(Sum(raw)) }

// checkChunk reports whether ch can place a piece of the given shape.
func checkChunk(ch *Chunk, shape []int64) error {
	if len(ch.GlobalShape) != len(shape) || len(ch.Offsets) != len(shape) {
		return fmt.Errorf("chunk with %d global dimensions and %d offsets for a tensor of %d dimensions",
			len(ch.GlobalShape), len(ch.Offsets), len(shape))
	}
	for d := range shape {
		if ch.Offsets[d] < 0 || ch.GlobalShape[d] < shape[d] || ch.Offsets[d] > ch.GlobalShape[d]-shape[d] {
			return fmt.Errorf("piece %v at %v does not fit in global shape %v", shape, ch.Offsets, ch.GlobalShape)
		}
	}
	return nil
}
