package shm

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// The fused copy and hash must give XXH3-64 bit for bit and the bytes
// themselves, at every length around the stripe, block and leaf
// boundaries, with src at any alignment.
func TestCopyHashIsXXH3(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, LeafSize+4096)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	var lens []int
	for _, b := range []int{0, 1, 64, 240, 1024, 2048, fusedMin, fusedMin + 1024, fusedMin + 2048, LeafSize} {
		for d := -65; d <= 65; d++ {
			if b+d >= 0 && b+d <= LeafSize {
				lens = append(lens, b+d)
			}
		}
	}
	for range 200 {
		lens = append(lens, r.IntN(LeafSize+1))
	}
	dst := alignedBuf(LeafSize + 64)
	for _, n := range lens {
		for _, off := range []int{0, 1, 31, 4095} {
			s := src[off : off+n]
			clear(dst)
			if got, want := copyHash(dst[:n], s), xxh3.Hash(s); got != want {
				t.Fatalf("length %d, source offset %d: hash %x, XXH3-64 %x", n, off, got, want)
			}
			if !bytes.Equal(dst[:n], s) {
				t.Fatalf("length %d, source offset %d: the copy differs", n, off)
			}
			if dst[n] != 0 {
				t.Fatalf("length %d: wrote past the destination", n)
			}
		}
	}
}

// A destination not aligned for streaming stores takes the plain path,
// with the same result; one aligned on 32 bytes (not 64) the kernel.
func TestCopyHashUnalignedDestination(t *testing.T) {
	src := make([]byte, fusedMin+3*xxh3Block+17)
	for i := range src {
		src[i] = byte(i * 7)
	}
	buf := alignedBuf(len(src) + 64)
	for _, off := range []int{1, 8, 16, 32, 33} {
		dst := buf[off : off+len(src)]
		if got, want := copyHash(dst, src), xxh3.Hash(src); got != want || !bytes.Equal(dst, src) {
			t.Fatalf("destination offset %d: hash %x, want %x (bytes equal: %v)", off, got, want, bytes.Equal(dst, src))
		}
	}
}

// The kernel's lanes after whole blocks are the portable loop's, and it
// copies exactly those blocks. Where there is no kernel there is nothing
// to compare, and the test says so rather than pass.
func TestKernelMatchesThePortableLoop(t *testing.T) {
	if !fusedCopyHash {
		t.Skip("no fused copy-hash kernel on this machine (amd64 with AVX2)")
	}
	r := rand.New(rand.NewPCG(3, 4))
	src := make([]byte, 40*xxh3Block)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	dst := alignedBuf(len(src) + xxh3Block)
	for _, blocks := range []int{1, 2, 16, 39} {
		clear(dst)
		got, want := xxh3Init, xxh3Init
		accumCopyBlocks(&got, dst, src, blocks)
		accumBlocksGeneric(&want, src, blocks)
		if got != want {
			t.Fatalf("%d blocks: lanes %x, want %x", blocks, got, want)
		}
		n := blocks * xxh3Block
		if !bytes.Equal(dst[:n], src[:n]) || slices.ContainsFunc(dst[n:], func(b byte) bool { return b != 0 }) {
			t.Fatalf("%d blocks: did not copy exactly the blocks", blocks)
		}
	}
}

// The portable block loop (the kernel's reference, and the code other
// architectures run) gives XXH3-64 too.
func TestAccumBlocksGenericIsXXH3(t *testing.T) {
	src := make([]byte, 5*xxh3Block+100)
	for i := range src {
		src[i] = byte(i*131 + i>>8)
	}
	acc := xxh3Init
	blocks := (len(src) - 1) / xxh3Block
	accumBlocksGeneric(&acc, src, blocks)
	if got, want := xxh3Finish(&acc, src, blocks*xxh3Block), xxh3.Hash(src); got != want {
		t.Fatalf("hash %x, XXH3-64 %x", got, want)
	}
}

func FuzzCopyHash(f *testing.F) {
	f.Add([]byte("x"), uint8(0))
	f.Add(bytes.Repeat([]byte{0xa5}, 3000), uint8(3))
	f.Fuzz(func(t *testing.T, src []byte, off uint8) {
		dst := alignedBuf(len(src) + int(off)%64 + 1)[int(off)%64:][:len(src)]
		if got, want := copyHash(dst, src), xxh3.Hash(src); got != want || !bytes.Equal(dst, src) {
			t.Fatalf("%d bytes, destination offset %d: hash %x, want %x", len(src), off%64, got, want)
		}
	})
}

// alignedBuf returns n bytes starting at a 64-byte boundary.
func alignedBuf(n int) []byte {
	b := make([]byte, n+64)
	off := 0
	for uintptr(unsafe.Pointer(&b[off]))%64 != 0 {
		off++
	}
	return b[off : off+n : off+n]
}

// BenchmarkCopyHash times, leaf by leaf over 256 MiB on one thread, a
// plain copy (the limit), a copy then a hash, and copyHash, one after
// the other in each iteration (ns/op covers the three), and reports the median over the
// iterations of each one's bandwidth against the copy beside it: the
// memory bandwidth of a shared machine moves too much from one second to
// the next for bandwidths measured apart to compare.
func BenchmarkCopyHash(b *testing.B) {
	const size = 256 << 20
	src, dst := make([]byte, size), alignedBuf(size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src)
	pass := func(f func(d, s []byte)) float64 {
		t0 := time.Now()
		for j := range NumLeaves(size) {
			f(leaf(dst, j), leaf(src, j))
		}
		return time.Since(t0).Seconds()
	}
	var plain, twoPass, fused []float64
	for b.Loop() {
		c := pass(func(d, s []byte) { copy(d, s) })
		plain = append(plain, size/c/1e9)
		twoPass = append(twoPass, c/pass(func(d, s []byte) { copy(d, s); sink ^= xxh3.Hash(s) }))
		fused = append(fused, c/pass(func(d, s []byte) { sink ^= copyHash(d, s) }))
	}
	b.ReportMetric(median(plain), "copy-GB/s")
	b.ReportMetric(median(twoPass), "copy-then-hash/copy")
	b.ReportMetric(median(fused), "copyHash/copy")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

var sink uint64
