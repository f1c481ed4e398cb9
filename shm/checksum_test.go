package shm_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"

	"rewind.dev/rewind/shm"
)

// refSum is ChecksumAlgo written from its definition, independently of
// checksum.go (and with xxh3's streaming hasher, not its one-shot Hash): the
// bytes cut into 1 MiB leaves, the XXH3-64 of each leaf appended as 8
// little-endian bytes, and the XXH3-64 of that concatenation.
func refSum(b []byte) uint64 {
	const leaf = 1 << 20
	var cat []byte
	for off := 0; off < len(b); off += leaf {
		h := xxh3.New()
		h.Write(b[off:min(off+leaf, len(b))])
		cat = binary.LittleEndian.AppendUint64(cat, h.Sum64())
	}
	h := xxh3.New()
	h.Write(cat)
	return h.Sum64()
}

// xorshiftBytes is the test buffer of LLVM's xxhash unit test
// (llvm/unittests/Support/xxhashTest.cpp), whose XXH3-64 values come from
// the reference C implementation.
func xorshiftBytes(n int) []byte {
	a := make([]byte, n)
	x := uint64(1)
	for i := range a {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		a[i] = byte(x)
	}
	return a
}

// TestChecksumAlgoDefinition pins the checksum that every SDK must compute
// identically. If it fails, ChecksumAlgo's definition changed and with it
// the meaning of every stored shard: that needs a new ChecksumAlgo name.
func TestChecksumAlgoDefinition(t *testing.T) {
	if shm.ChecksumAlgo != "xxh3-64-tree-1MiB" || shm.LeafSize != 1<<20 {
		t.Fatalf("ChecksumAlgo %q, LeafSize %d: the name and the leaf size are a cross-language contract", shm.ChecksumAlgo, shm.LeafSize)
	}
	// The primitive: XXH3-64, seed 0, as the reference implementation.
	buf := xorshiftBytes(2243)
	for n, want := range map[int]uint64{
		0: 0x2d06800538d394c2, 1: 0xd0d496e05c553485, 3: 0x6ea2d59aca5c3778,
		17: 0xed4be912ba5f836d, 129: 0xbc7138129bf065da, 403: 0xcefeb3ffa532ad8c,
		2048: 0x330ce110cbb79eae, 2243: 0x0979f786a24edde7,
	} {
		h := xxh3.New()
		h.Write(buf[:n])
		if got := h.Sum64(); got != want {
			t.Errorf("XXH3-64 of %d reference bytes = %#x, want %#x", n, got, want)
		}
	}
	// The tree: test vectors for other SDKs, over the same xorshift stream.
	data := xorshiftBytes(3*shm.LeafSize + 17)
	for n, want := range map[int]uint64{
		0:                   0x2d06800538d394c2, // no leaves: XXH3 of nothing
		1:                   0xe188938e092a425e,
		shm.LeafSize:        0x4f897c156770501e,
		shm.LeafSize + 1:    0xf1fd7f108b36b186,
		3*shm.LeafSize + 17: 0x51e390be92ccf224,
	} {
		if got := refSum(data[:n]); got != want {
			t.Errorf("reference tree sum of %d bytes = %#x, want %#x", n, got, want)
		}
		if got := shm.Sum(data[:n]); got != want {
			t.Errorf("Sum of %d bytes = %#x, want %#x", n, got, want)
		}
		if got := shm.CopyAndSum([]shm.Copy{{Src: data[:n]}}, 3)[0]; got != want {
			t.Errorf("CopyAndSum of %d bytes = %#x, want %#x", n, got, want)
		}
	}
	for v, want := range map[uint64]string{0: "0000000000000000", 0xab: "00000000000000ab", 0xDEADBEEF01234567: "deadbeef01234567"} {
		if got := shm.FormatSum(v); got != want {
			t.Errorf("FormatSum(%#x) = %q, want %q", v, got, want)
		}
	}
}

func TestSumMatchesCopyAndSum(t *testing.T) {
	const L = shm.LeafSize
	sizes := []int{0, 1, L - 1, L, L + 1, 5*L + 3}
	srcs := make([][]byte, len(sizes))
	for i, n := range sizes {
		srcs[i] = make([]byte, n)
		fill(srcs[i], uint64(i)+1)
	}
	for _, workers := range []int{0, 1, 2, 7} {
		t.Run("workers="+strconv.Itoa(workers), func(t *testing.T) {
			// One copy per call, then all in one call: together they are over
			// 8 MiB, which is where CopyAndSum goes parallel.
			for i, src := range srcs {
				checkCopyAndSum(t, [][]byte{src}, []bool{true}, workers, fmt.Sprintf("%d bytes alone", sizes[i]))
			}
			all := []bool{true, false, true, false, true, true}
			checkCopyAndSum(t, srcs, all, workers, "all sizes, some with nil Dst")
			// Empty copies around and between large ones, so that leaf
			// indices of neighbouring copies share a start.
			big := make([]byte, 9*L+5)
			fill(big, 99)
			mixed := [][]byte{nil, {}, big, nil, srcs[4], {}, {}, srcs[1], nil}
			checkCopyAndSum(t, mixed, []bool{true, false, true, true, false, true, true, true, true}, workers, "empty copies between large ones")
		})
	}
}

func checkCopyAndSum(t *testing.T, srcs [][]byte, withDst []bool, workers int, what string) {
	t.Helper()
	copies := make([]shm.Copy, len(srcs))
	orig := make([][]byte, len(srcs))
	for i, src := range srcs {
		orig[i] = bytes.Clone(src)
		if withDst[i] {
			copies[i] = shm.Copy{Dst: bytes.Repeat([]byte{0x5A}, len(src)), Src: src}
		} else {
			copies[i] = shm.Copy{Src: src}
		}
	}
	sums := shm.CopyAndSum(copies, workers)
	if len(sums) != len(srcs) {
		t.Fatalf("%s: %d sums for %d copies", what, len(sums), len(srcs))
	}
	for i, src := range srcs {
		if want := refSum(orig[i]); sums[i] != want || shm.Sum(src) != want {
			t.Errorf("%s, workers %d: copy %d (%d bytes): CopyAndSum %x, Sum %x, reference %x", what, workers, i, len(src), sums[i], shm.Sum(src), want)
		}
		if !bytes.Equal(src, orig[i]) {
			t.Errorf("%s: copy %d: source modified", what, i)
		}
		if copies[i].Dst != nil && !bytes.Equal(copies[i].Dst, src) {
			t.Errorf("%s, workers %d: copy %d (%d bytes): destination differs from source", what, workers, i, len(src))
		}
	}
}

func TestCopyAndSumPanicsOnLengthMismatch(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("CopyAndSum copied 4 bytes into a 3-byte destination without complaint")
		}
	}()
	shm.CopyAndSum([]shm.Copy{{Dst: make([]byte, 3), Src: make([]byte, 4)}}, 1)
}

// Every single-bit error in tensor data is caught by Verify and by CopyOut,
// with an error that wraps ErrCorrupt and names the tensor.
func TestBitFlipDetected(t *testing.T) {
	const L = shm.LeafSize
	specs := []shm.TensorSpec{
		{Name: "big", DType: shm.U8, Shape: []int64{8*L + 13}}, // over parallelMin with the rest
		{Name: "emb", DType: shm.BF16, Shape: []int64{L/2 + 3}},
		{Name: "norm", DType: shm.F32, Shape: []int64{7}},
		{Name: "step", DType: shm.I64},
		{Name: "flag", DType: shm.Bool, Shape: []int64{1}},
	}
	s := buildShard(t, testMeta, specs, nil)
	h, err := shm.DecodeBytes(s.file)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([][]byte, len(h.Tensors))
	for i, u := range h.Tensors {
		dst[i] = make([]byte, u.Len())
	}
	for _, tt := range h.Tensors {
		n := tt.Len()
		positions := map[int64]bool{0: true, n - 1: true, n / 2: true, int64(seedOf(tt.Name) % uint64(n)): true}
		for _, p := range []int64{L - 1, L, 5*L + 1, 8 * L} {
			if p < n {
				positions[p] = true
			}
		}
		k := 0
		for pos := range positions {
			for _, bit := range []uint{0, uint(pos % 8), 7} {
				k++
				workers := 1 + 3*(k%2) // serial and parallel
				at := h.DataStart + tt.Begin + pos
				s.file[at] ^= 1 << bit
				checkCorruptNamed(t, h.Verify(s.file, workers), tt.Name, fmt.Sprintf("Verify, bit %d of byte %d, workers %d", bit, pos, workers))
				checkCorruptNamed(t, h.CopyOut(s.file, dst, 5-workers), tt.Name, fmt.Sprintf("CopyOut, bit %d of byte %d, workers %d", bit, pos, 5-workers))
				checkCorruptNamed(t, h.VerifyAt(bytes.NewReader(s.file), workers), tt.Name, fmt.Sprintf("VerifyAt, bit %d of byte %d, workers %d", bit, pos, workers))
				s.file[at] ^= 1 << bit
			}
		}
	}
	if err := h.Verify(s.file, 2); err != nil {
		t.Fatalf("after restoring every bit, Verify: %v", err)
	}
	for _, workers := range []int{1, 2, 3} {
		if err := h.VerifyAt(bytes.NewReader(s.file), workers); err != nil {
			t.Fatalf("after restoring every bit, VerifyAt with %d workers: %v", workers, err)
		}
	}
}

// VerifyAt of a file it cannot read whole is an error, not corruption.
func TestVerifyAtReadError(t *testing.T) {
	s := buildShard(t, testMeta, []shm.TensorSpec{{Name: "a", DType: shm.U8, Shape: []int64{3*shm.LeafSize + 1}}}, nil)
	h, err := shm.DecodeBytes(s.file)
	if err != nil {
		t.Fatal(err)
	}
	for _, workers := range []int{1, 2} {
		err := h.VerifyAt(bytes.NewReader(s.file[:len(s.file)-1]), workers)
		if err == nil || errors.Is(err, shm.ErrCorrupt) {
			t.Errorf("VerifyAt of a short file with %d workers: %v, want a read error", workers, err)
		}
	}
}

func checkCorruptNamed(t *testing.T, err error, tensor, what string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s in tensor %q: not detected", what, tensor)
		return
	}
	if !errors.Is(err, shm.ErrCorrupt) || !strings.Contains(err.Error(), strconv.Quote(tensor)) {
		t.Errorf("%s in tensor %q: error %q does not wrap ErrCorrupt or does not name the tensor", what, tensor, err)
	}
}

func TestVerifyWrongSize(t *testing.T) {
	s := buildShard(t, testMeta, []shm.TensorSpec{{Name: "a", DType: shm.U8, Shape: []int64{10}}}, nil)
	h, err := shm.DecodeBytes(s.file)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{s.file[:len(s.file)-1], append(bytes.Clone(s.file), 0)} {
		if err := h.Verify(b, 1); !errors.Is(err, shm.ErrCorrupt) {
			t.Errorf("Verify of a %d-byte file, header for %d: %v", len(b), h.Size, err)
		}
		if err := h.CopyOut(b, [][]byte{make([]byte, 10)}, 1); !errors.Is(err, shm.ErrCorrupt) {
			t.Errorf("CopyOut of a %d-byte file, header for %d: %v", len(b), h.Size, err)
		}
	}
}
