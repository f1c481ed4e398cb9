package shm_test

import (
	"encoding/binary"
	"encoding/json"
	"hash/fnv"
	"testing"

	"rewind.dev/rewind/shm"
)

// specElemSize is the element size of every dtype the safetensors
// specification names, written out here rather than taken from package shm so
// that the tests check shm against the specification and not against itself.
var specElemSize = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"F64": 8, "I64": 8, "U64": 8, "C64": 8,
}

// allDTypes lists every dtype declared in dtype.go.
var allDTypes = []shm.DType{
	shm.Bool, shm.U8, shm.I8, shm.F8E5M2, shm.F8E4M3,
	shm.I16, shm.U16, shm.F16, shm.BF16,
	shm.I32, shm.U32, shm.F32,
	shm.F64, shm.I64, shm.U64, shm.C64,
}

// fill writes reproducible pseudo-random bytes (xorshift64) into b.
func fill(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

func seedOf(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// shard is a complete shard built the way a writer builds one: plan a
// Layout, copy every tensor into place while summing it, record the sums and
// write the header.
type shard struct {
	layout *shm.Layout
	file   []byte            // header and data, as stored in a segment
	data   map[string][]byte // each tensor's bytes, by name
}

func buildShard(tb testing.TB, meta shm.ShardMeta, specs []shm.TensorSpec, objects []byte) shard {
	tb.Helper()
	l, err := shm.NewLayout(meta, specs, objects)
	if err != nil {
		tb.Fatalf("NewLayout: %v", err)
	}
	file := make([]byte, l.Size)
	data := make(map[string][]byte, len(specs))
	copies := make([]shm.Copy, len(l.Tensors))
	for i, t := range l.Tensors {
		src := make([]byte, t.End-t.Begin)
		fill(src, seedOf(t.Name))
		data[t.Name] = src
		copies[i] = shm.Copy{Dst: file[l.DataStart+t.Begin : l.DataStart+t.End], Src: src}
	}
	for i, s := range shm.CopyAndSum(copies, 0) {
		l.SetSum(i, s)
	}
	hdr := l.Header()
	if int64(len(hdr)) != l.DataStart {
		tb.Fatalf("Header() is %d bytes, DataStart is %d", len(hdr), l.DataStart)
	}
	copy(file, hdr)
	return shard{layout: l, file: file, data: data}
}

// rawFile assembles a safetensors file from header JSON text and data, the
// header padded with spaces to a multiple of 8 bytes as the reference
// implementation pads it (not 4 KiB, as rewind does).
func rawFile(header string, data []byte) []byte {
	h := []byte(header)
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	b = append(b, h...)
	return append(b, data...)
}

// jsonFile marshals a header given as Go values and assembles a file.
func jsonFile(tb testing.TB, header map[string]any, data []byte) []byte {
	tb.Helper()
	j, err := json.Marshal(header)
	if err != nil {
		tb.Fatal(err)
	}
	return rawFile(string(j), data)
}

func tensorJSON(dtype string, shape []int64, begin, end int64) map[string]any {
	if shape == nil {
		shape = []int64{}
	}
	return map[string]any{"dtype": dtype, "shape": shape, "data_offsets": []int64{begin, end}}
}

// testMeta is a valid ShardMeta for tests that do not care about it.
var testMeta = shm.ShardMeta{Job: "job-1", Rank: 1, WorldSize: 4, Step: 100}
