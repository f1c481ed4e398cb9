package shm_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"rewind.dev/rewind/shm"
)

// streamSpecs has leaves cut at every kind of boundary: a tensor of whole
// leaves, tensors ending inside a leaf, an empty tensor, tiny ones.
var streamSpecs = []shm.TensorSpec{
	{Name: "big", DType: shm.U8, Shape: []int64{3*shm.LeafSize + 13}},
	{Name: "whole", DType: shm.F32, Shape: []int64{shm.LeafSize / 4 * 2}},
	{Name: "emb", DType: shm.BF16, Shape: []int64{shm.LeafSize/2 + 3}},
	{Name: "empty", DType: shm.F32, Shape: []int64{0}},
	{Name: "norm", DType: shm.F32, Shape: []int64{7}},
	{Name: "step", DType: shm.I64},
}

// arrive feeds s the shard b in pieces of random sizes (at most max bytes),
// the way a socket delivers it, calling touch on each piece before it is
// reported.
func arrive(s *shm.StreamCheck, b []byte, rng *rand.Rand, max int, touch func(lo, hi int)) {
	for off := 0; off < len(b); {
		end := min(off+1+rng.IntN(max), len(b))
		if touch != nil {
			touch(off, end)
		}
		s.Arrived(int64(end))
		off = end
	}
}

// StreamCheck agrees with Verify on a whole shard, however its bytes
// arrive, and catches a bit flipped in any tensor before its leaf is
// reported, naming the tensor.
func TestStreamCheck(t *testing.T) {
	s := buildShard(t, testMeta, streamSpecs, []byte(`{"lr":0.5}`))
	h, err := shm.DecodeBytes(s.file)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Verify(s.file, 2); err != nil {
		t.Fatal(err)
	}
	for seed, max := range []int{1 << 10, 100_000, shm.LeafSize + 7, 8 << 20} {
		rng := rand.New(rand.NewPCG(uint64(seed), 1))
		dst := make([]byte, len(s.file))
		c := h.NewStreamCheck(dst)
		arrive(c, s.file, rng, max, func(lo, hi int) { copy(dst[lo:hi], s.file[lo:hi]) })
		if err := c.Check(); err != nil {
			t.Fatalf("pieces of up to %d bytes: %v", max, err)
		}
	}
	for i, tt := range h.Tensors {
		if tt.Len() == 0 {
			continue
		}
		for _, pos := range []int64{0, tt.Len() / 2, tt.Len() - 1} {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(pos)))
			at := int(h.DataStart + tt.Begin + pos)
			dst := bytes.Clone(s.file)
			c := h.NewStreamCheck(dst)
			arrive(c, s.file, rng, 3<<20, func(lo, hi int) {
				if lo <= at && at < hi {
					dst[at] ^= 0x10 // damaged in flight: before it is reported
				}
			})
			checkCorruptNamed(t, c.Check(), tt.Name, fmt.Sprintf("StreamCheck, byte %d", pos))
		}
	}
}

// A shard that has not arrived whole, or whose buffer is not the size the
// header says, is refused.
func TestStreamCheckIncomplete(t *testing.T) {
	s := buildShard(t, testMeta, streamSpecs, nil)
	h, err := shm.DecodeBytes(s.file)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		b       []byte
		arrived int64
	}{
		"nothing":         {s.file, 0},
		"header only":     {s.file, h.DataStart},
		"all but a byte":  {s.file, h.Size - 1},
		"buffer too long": {append(bytes.Clone(s.file), 0), h.Size + 1},
		"buffer short":    {s.file[:h.Size-1], h.Size - 1},
	} {
		c := h.NewStreamCheck(tc.b)
		c.Arrived(tc.arrived)
		if err := c.Check(); !errors.Is(err, shm.ErrCorrupt) {
			t.Errorf("%s: Check says %v, want ErrCorrupt", name, err)
		}
	}
}
