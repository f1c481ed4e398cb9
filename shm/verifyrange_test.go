package shm

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// A range of a piece is checked by the leaves it touches alone, against
// leaf hashes that must root to the piece's checksum.
func TestVerifyRange(t *testing.T) {
	b := make([]byte, 3*LeafSize+LeafSize/2)
	rng := rand.New(rand.NewPCG(1, 2))
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
