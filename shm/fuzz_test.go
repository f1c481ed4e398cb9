package shm_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"rewind.dev/rewind/shm"
)

// FuzzDecodeHeader feeds Decode arbitrary bytes. Decode must never panic,
// and whatever it accepts must be safe to index with: tensors sorted and
// contiguous, covering exactly the data section, each as long as its dtype
// and shape say. Verify and CopyOut on an accepted header must not panic.
func FuzzDecodeHeader(f *testing.F) {
	seeds := [][]shm.TensorSpec{
		nil,
		{{Name: "w", DType: shm.F32, Shape: []int64{2, 3}}, {Name: "b", DType: shm.U8, Shape: []int64{3}}},
		{{Name: "s", DType: shm.I64}, {Name: "e", DType: shm.BF16, Shape: []int64{0}}, {Name: "q\"<", DType: shm.Bool, Shape: []int64{3, 0}}},
		{{Name: "c", DType: shm.C64, Shape: []int64{2}, Chunk: &shm.Chunk{GlobalShape: []int64{8}, Offsets: []int64{4}}}},
	}
	for i, specs := range seeds {
		var objects []byte
		if i%2 == 1 {
			objects = []byte(`{"lr":0.1,"rng":[1,2]}`)
		}
		s := buildShard(f, testMeta, specs, objects)
		if i == 1 {
			f.Add(s.file) // as written: padded to 4 KiB
		}
		// The same shard with its padding trimmed (still valid: Decode
		// does not require the alignment), which keeps inputs small for
		// the mutator, and a few corruptions of it: data cut short, header
		// length off by one, a byte of the JSON changed.
		n := int(binary.LittleEndian.Uint64(s.file))
		trimmed := bytes.TrimRight(s.file[8:8+n], " ")
		small := append(rawFile(string(trimmed), nil), s.file[8+n:]...)
		f.Add(small)
		f.Add(small[:len(small)-1])
		b := bytes.Clone(small)
		binary.LittleEndian.PutUint64(b, binary.LittleEndian.Uint64(b)+1)
		f.Add(b)
		b = bytes.Clone(small)
		b[20] ^= 0x01
		f.Add(b)
	}
	f.Add(rawFile(`{"__metadata__":{"format":"pt"},"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, []byte{1, 2}))
	f.Add(rawFile(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`, make([]byte, 6)))
	f.Add([]byte{})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, '{', '}'})

	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := shm.DecodeBytes(b)
		if err != nil {
			if h != nil {
				t.Fatalf("header returned with error %v", err)
			}
			return
		}
		if h.Size != int64(len(b)) || h.DataStart != 8+h.HeaderLen || h.DataStart > h.Size {
			t.Fatalf("Size %d DataStart %d HeaderLen %d for a %d-byte file", h.Size, h.DataStart, h.HeaderLen, len(b))
		}
		var off int64
		for i, tt := range h.Tensors {
			if tt.Begin != off {
				t.Fatalf("tensor %d %q at [%d,%d), previous ends at %d", i, tt.Name, tt.Begin, tt.End, off)
			}
			n, err := tt.DType.NumBytes(tt.Shape)
			if err != nil || tt.End-tt.Begin != n {
				t.Fatalf("tensor %q %s%v spans %d bytes, NumBytes %d, %v", tt.Name, tt.DType, tt.Shape, tt.End-tt.Begin, n, err)
			}
			off = tt.End
		}
		if off != h.Size-h.DataStart {
			t.Fatalf("tensors cover %d bytes of a %d-byte data section", off, h.Size-h.DataStart)
		}
		if h.Rewind {
			for _, tt := range h.Tensors {
				if !tt.HasSum {
					t.Fatalf("rewind shard accepted without a checksum for %q", tt.Name)
				}
			}
			if err := shm.ValidateJob(h.Meta.Job); err != nil || h.Meta.Rank >= h.Meta.WorldSize || h.Meta.Step < 0 {
				t.Fatalf("rewind shard accepted with meta %+v", h.Meta)
			}
		}
		err = h.Verify(b, 2)
		if err != nil && !errors.Is(err, shm.ErrCorrupt) {
			t.Fatalf("Verify: %v does not wrap ErrCorrupt", err)
		}
		dst := make([][]byte, len(h.Tensors))
		for i, tt := range h.Tensors {
			dst[i] = make([]byte, tt.Len())
		}
		if cerr := h.CopyOut(b, dst, 1); (cerr == nil) != (err == nil) {
			t.Fatalf("Verify says %v, CopyOut says %v", err, cerr)
		}
	})
}
