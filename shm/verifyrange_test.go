package shm

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomPiece is n random bytes (seeded), their leaf hashes and their
// checksum, which the leaves root to.
func randomPiece(t *testing.T, n int, seed uint64) ([]byte, [][]uint64, uint64) {
	t.Helper()
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, seed+1))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	leaves, err := LeavesAt(bytes.NewReader(b), []Section{{0, int64(len(b))}}, 2)
	if err != nil {
		t.Fatal(err)
	}
	sum := Sum(b)
	if RootOf(leaves[0]) != sum {
		t.Fatal("the leaves do not root to Sum")
	}
	return b, leaves, sum
}

// A range of a piece is checked by the leaves it touches alone, against
// leaf hashes that must root to the piece's checksum.
func TestVerifyRange(t *testing.T) {
	b, leaves, sum := randomPiece(t, 3*LeafSize+LeafSize/2, 1)
	done := map[int]bool{}
	n, err := VerifyRange(b, LeafSize+10, LeafSize+20, leaves[0], sum, done)
	if err != nil || n != LeafSize {
		t.Fatalf("one leaf's range: hashed %d, %v; want %d", n, err, LeafSize)
	}
	if n, err := VerifyRange(b, LeafSize, 2*LeafSize, leaves[0], sum, done); err != nil || n != 0 {
		t.Fatalf("the same leaf again: hashed %d, %v; want 0", n, err)
	}
	if n, err := VerifyRange(b, 2*LeafSize-1, int64(len(b)), leaves[0], sum, nil); err != nil || n != 2*LeafSize+LeafSize/2 {
		t.Fatalf("to the end: hashed %d, %v", n, err)
	}

	bad := bytes.Clone(b)
	bad[2*LeafSize+5] ^= 1
	if _, err := VerifyRange(bad, 0, 2*LeafSize, leaves[0], sum, nil); err != nil {
		t.Fatalf("a range before the flipped byte: %v", err)
	}
	if _, err := VerifyRange(bad, 2*LeafSize, 2*LeafSize+6, leaves[0], sum, nil); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "leaf 2") {
		t.Fatalf("a range over the flipped byte: %v", err)
	}
	forged := append([]uint64(nil), leaves[0]...)
	forged[3]++
	if _, err := VerifyRange(b, 0, 10, forged, sum, nil); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "do not make the checksum") {
		t.Fatalf("forged leaf hashes: %v", err)
	}
	if _, err := VerifyRange(b, 0, 10, leaves[0][:2], sum, nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("too few leaf hashes: %v", err)
	}
}

// VerifyCopyRange copies exactly the range and checks the leaves it
// touches as VerifyRange does, in parallel over the leaves.
func TestVerifyCopyRange(t *testing.T) {
	b, leaves, sum := randomPiece(t, 9*LeafSize+LeafSize/3, 3) // above parallelMin: the workers run
	ranges := [][2]int64{{0, int64(len(b))}, {LeafSize + 10, LeafSize + 20}, {LeafSize - 1, 5*LeafSize + 7}, {8*LeafSize + 3, int64(len(b))}, {7, 7}}
	for _, r := range ranges {
		for _, workers := range []int{1, 3} {
			dst := make([]byte, r[1]-r[0])
			done := map[int]bool{}
			n, err := VerifyCopyRange(dst, b, r[0], r[1], leaves[0], sum, done, workers)
			touched := int64(0)
			if r[1] > r[0] {
				touched = min(int64(len(b)), (r[1]-1)/LeafSize*LeafSize+LeafSize) - r[0]/LeafSize*LeafSize
			}
			if err != nil || n != touched || !bytes.Equal(dst, b[r[0]:r[1]]) {
				t.Fatalf("range %v, %d workers: hashed %d (want %d), %v, bytes equal %v", r, workers, n, touched, err, bytes.Equal(dst, b[r[0]:r[1]]))
			}
			// Checked leaves are copied again but not hashed again.
			clear(dst)
			if n, err := VerifyCopyRange(dst, b, r[0], r[1], leaves[0], sum, done, workers); err != nil || n != 0 || !bytes.Equal(dst, b[r[0]:r[1]]) {
				t.Fatalf("range %v again: hashed %d, %v", r, n, err)
			}
		}
	}
	bad := bytes.Clone(b)
	bad[4*LeafSize+5] ^= 1
	if _, err := VerifyCopyRange(make([]byte, 4*LeafSize), bad, 0, 4*LeafSize, leaves[0], sum, nil, 2); err != nil {
		t.Fatalf("a range before the flipped byte: %v", err)
	}
	if _, err := VerifyCopyRange(make([]byte, 3*LeafSize), bad, 3*LeafSize, 6*LeafSize, leaves[0], sum, nil, 2); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "leaf 4") {
		t.Fatalf("a range over the flipped byte: %v", err)
	}
	forged := append([]uint64(nil), leaves[0]...)
	forged[3]++
	if _, err := VerifyCopyRange(make([]byte, 10), b, 0, 10, forged, sum, nil, 2); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("forged leaf hashes: %v", err)
	}
}
