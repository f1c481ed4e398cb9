package tiers

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"rewind.dev/rewind/shm"
)

// makeShard builds the bytes of a shard as the SDK writes them.
func makeShard(t *testing.T, job string, step int64, rank, ws uint32) ([]byte, string) {
	t.Helper()
	w := data(100_000+int(rank)*4, byte(step)+byte(rank))
	l, err := shm.NewLayout(shm.ShardMeta{Job: job, Rank: rank, WorldSize: ws, Step: step},
		[]shm.TensorSpec{{Name: "w", DType: shm.U8, Shape: []int64{int64(len(w))}}}, []byte(`{"lr":0.1}`))
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, l.Size)
	sums := shm.CopyAndSum([]shm.Copy{{Dst: b[l.DataStart:], Src: w}}, 1)
	l.SetSum(0, sums[0])
	copy(b, l.Header())
	return b, shm.HeaderSum(l.Header())
}

// putStep stores every rank's shard of a step and returns its manifest
// (not yet written).
func putStep(t *testing.T, st Store, job string, step int64, ws uint32) (*Manifest, [][]byte) {
	t.Helper()
	m := &Manifest{Job: job, Step: step, WorldSize: ws}
	var shards [][]byte
	for r := range ws {
		b, sum := makeShard(t, job, step, r, ws)
		if err := st.Put(context.Background(), ShardName(job, step, r), bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
		m.Shards = append(m.Shards, ShardEntry{Rank: r, Size: int64(len(b)), HeaderChecksum: sum})
		shards = append(shards, b)
	}
	return m, shards
}

func TestManifestMakesTheCopyExist(t *testing.T) {
	dir := t.TempDir()
	st, err := NewFileStore(dir, NVMeOptions())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, shards := putStep(t, st, "job", 7, 3)
	// Shards without a manifest are not a copy.
	if steps, _ := Steps(ctx, st, "job"); len(steps) != 0 {
		t.Fatalf("steps before the manifest: %v", steps)
	}
	if _, err := ReadManifest(ctx, st, "job", 7); !IsNotExist(err) {
		t.Fatalf("manifest before it is written: %v", err)
	}
	if err := WriteManifest(ctx, st, m); err != nil {
		t.Fatal(err)
	}
	if steps, _ := Steps(ctx, st, "job"); len(steps) != 1 || steps[0] != 7 {
		t.Fatalf("steps: %v", steps)
	}
	got, err := ReadManifest(ctx, st, "job", 7)
	if err != nil || got.WorldSize != 3 {
		t.Fatalf("read manifest: %+v %v", got, err)
	}
	for r, want := range shards {
		dst := make([]byte, len(want))
		if err := GetShard(ctx, st, got, uint32(r), dst, 2); err != nil || !bytes.Equal(dst, want) {
			t.Fatalf("rank %d: %v, bit-identical %v", r, err, bytes.Equal(dst, want))
		}
	}
	// A flipped byte in a tier copy is caught on the way back.
	path := filepath.Join(dir, filepath.FromSlash(ShardName("job", 7, 1)))
	b, _ := os.ReadFile(path)
	b[len(b)-3] ^= 0x10
	os.WriteFile(path, b, 0o640)
	dst := make([]byte, len(b))
	if err := GetShard(ctx, st, got, 1, dst, 2); !errors.Is(err, shm.ErrCorrupt) {
		t.Fatalf("get of a corrupted tier copy: %v, want ErrCorrupt", err)
	}
}

func TestManifestRefusedWhenAShardIsMissing(t *testing.T) {
	st, err := NewFileStore(t.TempDir(), NVMeOptions())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, _ := putStep(t, st, "job", 3, 2)
	if err := st.Delete(ctx, ShardName("job", 3, 1)); err != nil {
		t.Fatal(err)
	}
	if err := WriteManifest(ctx, st, m); !IsNotExist(err) {
		t.Fatalf("manifest over a missing shard: %v", err)
	}
	m.Shards[0].Size++
	if err := WriteManifest(ctx, st, m); err == nil {
		t.Fatal("manifest with a wrong size accepted")
	}
	if steps, _ := Steps(ctx, st, "job"); len(steps) != 0 {
		t.Fatalf("a refused manifest left a copy: %v", steps)
	}
}

// A node-local tier holds the shards of its node's ranks only: its manifest
// describes the whole step, names the ranks it holds, and serves only those.
func TestManifestOfANodeLocalTier(t *testing.T) {
	st, err := NewFileStore(t.TempDir(), NVMeOptions())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, shards := putStep(t, st, "job", 5, 4)
	for _, r := range []uint32{0, 2} {
		if err := st.Delete(ctx, ShardName("job", 5, r)); err != nil {
			t.Fatal(err)
		}
	}
	if err := WriteManifest(ctx, st, m); !IsNotExist(err) {
		t.Fatalf("manifest of every rank over a store holding two: %v", err)
	}
	m.Here = []uint32{3, 1}
	if err := WriteManifest(ctx, st, m); err == nil {
		t.Fatal("ranks here out of order accepted")
	}
	m.Here = []uint32{1, 3}
	if err := WriteManifest(ctx, st, m); err != nil {
		t.Fatal(err)
	}
	got, err := ReadManifest(ctx, st, "job", 5)
	if err != nil || !slices.Equal(got.Here, []uint32{1, 3}) || len(got.Shards) != 4 {
		t.Fatalf("read manifest: %+v %v", got, err)
	}
	for r := range uint32(4) {
		dst := make([]byte, len(shards[r]))
		err := GetShard(ctx, st, got, r, dst, 2)
		if got.Holds(r) != (err == nil) || !got.Holds(r) && !IsNotExist(err) {
			t.Fatalf("rank %d (held %v): %v", r, got.Holds(r), err)
		}
		if err == nil && !bytes.Equal(dst, shards[r]) {
			t.Fatalf("rank %d not bit-identical", r)
		}
	}
}
