package tiers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"

	"rewind.dev/rewind/shm"
)

// leafShard is a shard of two tensors, 2.5 MiB and 10 bytes, with the
// leaf hashes a verification finds.
func leafShard(t *testing.T) ([]byte, *shm.Header, [][]uint64) {
	t.Helper()
	a, b := data(5<<19, 7), data(10, 9)
	l, err := shm.NewLayout(shm.ShardMeta{Job: "lv", Rank: 1, WorldSize: 2, Step: 3},
		[]shm.TensorSpec{{Name: "a", DType: shm.U8, Shape: []int64{int64(len(a))}}, {Name: "b", DType: shm.U8, Shape: []int64{10}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	shard := make([]byte, l.Size)
	at := func(i int) []byte { return shard[l.DataStart+l.Tensors[i].Begin : l.DataStart+l.Tensors[i].End] }
	sums := shm.CopyAndSum([]shm.Copy{{Dst: at(0), Src: a}, {Dst: at(1), Src: b}}, 1)
	l.SetSum(0, sums[0])
	l.SetSum(1, sums[1])
	copy(shard, l.Header())
	h, err := shm.DecodeBytes(shard)
	if err != nil {
		t.Fatal(err)
	}
	leaves, err := h.VerifyAtLeaves(bytes.NewReader(shard), 1)
	if err != nil {
		t.Fatal(err)
	}
	return shard, h, leaves
}

// TestLeavesCheckedAgainstTheHeader: leaf hashes read back from a tier
// are the ones written, and any that do not make the header's checksums
// (a flipped hash, a missing or extra one, another shard's) are refused
// as corrupt; a copy with none is not found.
func TestLeavesCheckedAgainstTheHeader(t *testing.T) {
	ctx := context.Background()
	_, h, leaves := leafShard(t)
	st, err := NewFileStore(filepath.Join(t.TempDir(), "pfs"), PFSOptions())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := GetLeaves(ctx, st, "lv", 3, 1, h); !IsNotExist(err) {
		t.Fatalf("leaves of a copy that has none: %v, want not exist", err)
	}
	if err := PutLeaves(ctx, st, "lv", 3, 1, leaves); err != nil {
		t.Fatal(err)
	}
	got, err := GetLeaves(ctx, st, "lv", 3, 1, h)
	if err != nil || len(got) != 2 || len(got[0]) != 3 || got[0][2] != leaves[0][2] || got[1][0] != leaves[1][0] {
		t.Fatalf("leaves read back: %v %v, want %v", got, err, leaves)
	}
	enc := EncodeLeaves(leaves)
	flipped := bytes.Clone(enc)
	flipped[len(leavesMagic)+4+4+8] ^= 1 // the second leaf of tensor a
	other := [][]uint64{leaves[0][:2], leaves[1]}
	bad := map[string][]byte{
		"a flipped hash":      flipped,
		"a leaf missing":      EncodeLeaves(other),
		"a byte past the end": append(bytes.Clone(enc), 0),
		"truncated":           enc[:len(enc)-3],
		"no magic":            append([]byte("RWLEAF00"), enc[len(leavesMagic):]...),
		"empty":               nil,
	}
	for name, b := range bad {
		if _, err := DecodeLeaves(b, h); !errors.Is(err, shm.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
		if err := st.Put(ctx, LeavesName("lv", 3, 1), bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
		if _, err := GetLeaves(ctx, st, "lv", 3, 1, h); !errors.Is(err, shm.ErrCorrupt) {
			t.Errorf("%s, from the store: %v, want ErrCorrupt", name, err)
		}
	}
}

// TestReadRange: both stores read any range of an object, exactly; a
// range past the end is io.ErrUnexpectedEOF, a missing object not found.
func TestReadRange(t *testing.T) {
	ctx := context.Background()
	s3, _ := newS3(t, nil)
	var retried atomic.Int32
	s3.WatchRetries(func(string, string, int, error) { retried.Add(1) })
	fs, err := NewFileStore(filepath.Join(t.TempDir(), "pfs"), PFSOptions())
	if err != nil {
		t.Fatal(err)
	}
	obj := data(3<<20+17, 5)
	for _, st := range []Store{fs, s3} {
		if err := st.Put(ctx, "j/step-1/x", bytes.NewReader(obj), int64(len(obj))); err != nil {
			t.Fatal(err)
		}
		for _, r := range [][2]int64{{0, 8}, {1 << 20, 1 << 20}, {3<<20 + 16, 1}, {5, 3 << 20}, {7, 0}} {
			got := make([]byte, r[1])
			if err := ReadRange(ctx, st, "j/step-1/x", r[0], got); err != nil || !bytes.Equal(got, obj[r[0]:r[0]+r[1]]) {
				t.Errorf("%s: %d bytes at %d: %v, equal %t", st, r[1], r[0], err, bytes.Equal(got, obj[r[0]:r[0]+r[1]]))
			}
		}
		// A range past the end is what the object is: answered at once,
		// never retried.
		for _, off := range []int64{int64(len(obj)) - 4, int64(len(obj)) + 10} {
			if err := ReadRange(ctx, st, "j/step-1/x", off, make([]byte, 8)); !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("%s: a range at %d past the end: %v, want io.ErrUnexpectedEOF", st, off, err)
			}
		}
		if n := retried.Load(); n != 0 {
			t.Errorf("%s: %d requests retried, want none", st, n)
		}
		if err := ReadRange(ctx, st, "j/step-1/missing", 0, make([]byte, 8)); !IsNotExist(err) {
			t.Errorf("%s: a range of a missing object: %v, want not exist", st, err)
		}
	}
}
