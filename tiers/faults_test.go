package tiers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/vfs"
)

// The file tiers (NVMe, parallel filesystem) under faults injected into
// their file system (faultinject's fs/tier/write, fs/tier/sync and
// fs/tier/rename points): what a user relies on is that a failed write
// fails the Put and loses nothing that was there, and that a write which
// lied about succeeding is caught by the checks of the read path
// (ReadManifest, GetShard) rather than restored.

// faultChunk is the chunk size of the stores under test: small, so that a
// shard of faultShardBytes takes several writes.
const (
	faultChunk      = 1 << 16
	faultShardBytes = 5*faultChunk + 12345 // six writes, the last one short
)

// faultStoreOptions are the file tiers under test, with small chunks. The
// NVMe store writes shards with O_DIRECT (the default options only do so
// from 16 MiB up; the test's temporary directory takes it on ext4 and xfs,
// and falls back to buffered I/O on tmpfs).
func faultStoreOptions() map[string]FileOptions {
	nvme := NVMeOptions()
	nvme.ChunkBytes, nvme.DirectMinBytes = faultChunk, faultChunk
	pfs := PFSOptions()
	pfs.ChunkBytes = faultChunk
	return map[string]FileOptions{"nvme": nvme, "pfs": pfs}
}

// newFaultyFileStore opens a file store in a fresh directory whose file
// system is wrapped by a fault injector, as the agent wraps its tiers when
// started with --fault-injection.
func newFaultyFileStore(t *testing.T, opts FileOptions, seed uint64) (*FileStore, *faultinject.Injector, string) {
	t.Helper()
	in := faultinject.New(nil, seed)
	dir := t.TempDir()
	opts.FS = in.FS(vfs.Default, "tier")
	st, err := NewFileStore(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return st, in, dir
}

// faultShard builds the bytes of rank 0's shard of a step of a one-rank
// job, of exactly n bytes, as the SDK writes them; version varies the
// tensor's bytes, so that two versions of one shard differ.
func faultShard(t *testing.T, job string, step int64, n int, version byte) ([]byte, ShardEntry) {
	t.Helper()
	meta := shm.ShardMeta{Job: job, Rank: 0, WorldSize: 1, Step: step}
	objects := []byte(`{"lr":0.1}`)
	probe, err := shm.NewLayout(meta, []shm.TensorSpec{{Name: "w", DType: shm.U8, Shape: []int64{1}}}, objects)
	if err != nil {
		t.Fatal(err)
	}
	// The header's length depends a little on the tensor's size (its
	// digits); settle on a tensor size that makes the shard n bytes.
	w := int64(n) - probe.DataStart
	for range 4 {
		l, err := shm.NewLayout(meta, []shm.TensorSpec{{Name: "w", DType: shm.U8, Shape: []int64{w}}}, objects)
		if err != nil {
			t.Fatal(err)
		}
		if l.Size == int64(n) {
			tensor := data(int(w), version)
			b := make([]byte, l.Size)
			sums := shm.CopyAndSum([]shm.Copy{{Dst: b[l.DataStart:], Src: tensor}}, 1)
			l.SetSum(0, sums[0])
			copy(b, l.Header())
			return b, ShardEntry{Rank: 0, Size: l.Size, HeaderChecksum: shm.HeaderSum(l.Header())}
		}
		w += int64(n) - l.Size
	}
	t.Fatalf("no shard of exactly %d bytes", n)
	return nil, ShardEntry{}
}

// saveStep stores a one-rank step the way an agent's tier transfer does:
// the shard, then the manifest that makes the copy exist.
func saveStep(t *testing.T, st Store, job string, step int64, shard []byte, e ShardEntry) *Manifest {
	t.Helper()
	ctx := context.Background()
	if err := st.Put(ctx, ShardName(job, step, 0), bytes.NewReader(shard), int64(len(shard))); err != nil {
		t.Fatal(err)
	}
	m := &Manifest{Job: job, Step: step, WorldSize: 1, Shards: []ShardEntry{e}}
	if err := WriteManifest(ctx, st, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// restoreStep reads a one-rank step back through the checked read path of
// a restore: the manifest, then the shard checked against it.
func restoreStep(st Store, job string, step int64) ([]byte, *Manifest, error) {
	ctx := context.Background()
	m, err := ReadManifest(ctx, st, job, step)
	if err != nil {
		return nil, nil, err
	}
	dst := make([]byte, m.Shards[0].Size)
	return dst, m, GetShard(ctx, st, m, 0, dst, 2)
}

// TestFileStoreInjectedFailuresLoseNothing: a write that fails (ENOSPC,
// EIO, a short write), a failed fsync and a failed rename each fail the
// Put of a new version of an object, with an error that carries the errno
// and names the object; the earlier version of the shard and of the
// manifest stays whole and restorable, and no temporary file is left.
func TestFileStoreInjectedFailuresLoseNothing(t *testing.T) {
	type testcase struct {
		spec string // armed after the first version is stored
		want error  // errors.Is of the Put's error
		what string // in the Put's error: the operation that failed
	}
	cases := map[string]testcase{
		"write ENOSPC": {"fs/tier/write=error(ENOSPC)", syscall.ENOSPC, "writing"},
		"write EIO":    {"fs/tier/write=error(EIO)", syscall.EIO, "writing"},
		"short write":  {"fs/tier/write=short", io.ErrShortWrite, "writing"},
		"late ENOSPC":  {"fs/tier/write=3*off->error(ENOSPC)", syscall.ENOSPC, "writing"}, // after three chunks landed
		"fsync EIO":    {"fs/tier/sync=error(EIO)", syscall.EIO, "fsync"},
		"rename EIO":   {"fs/tier/rename=error(EIO)", syscall.EIO, "rename"},
	}
	run := func(t *testing.T, opts FileOptions, tc testcase) {
		st, in, dir := newFaultyFileStore(t, opts, 1)
		ctx := context.Background()
		const job, step = "job", 7
		old, oldEntry := faultShard(t, job, step, faultShardBytes, 1)
		oldMan := saveStep(t, st, job, step, old, oldEntry)

		if err := in.Set(tc.spec); err != nil {
			t.Fatal(err)
		}
		neu, _ := faultShard(t, job, step, faultShardBytes, 2)
		name := ShardName(job, step, 0)
		err := st.Put(ctx, name, bytes.NewReader(neu), int64(len(neu)))
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), tc.what) {
			t.Fatalf("Put under %s: %v\nwant an error wrapping %v that names %s and says %q", tc.spec, err, tc.want, name, tc.what)
		}
		// The manifest of the step rewritten (a retried transfer): same
		// shards, a later time.
		again := *oldMan
		again.WrittenAt = oldMan.WrittenAt.Add(1)
		if err := WriteManifest(ctx, st, &again); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), ManifestName(job, step)) {
			t.Fatalf("WriteManifest under %s: %v, want an error wrapping %v naming the manifest", tc.spec, err, tc.want)
		}
		point := strings.SplitN(tc.spec, "=", 2)[0]
		if in.Hits()[point] == 0 {
			t.Fatalf("%s never fired", point)
		}
		in.Clear()

		got, m, err := restoreStep(st, job, step)
		if err != nil {
			t.Fatalf("restore of the earlier version after a failed Put: %v", err)
		}
		if !bytes.Equal(got, old) {
			t.Fatal("the earlier version of the shard changed under a failed Put")
		}
		if !m.WrittenAt.Equal(oldMan.WrittenAt) {
			t.Fatalf("the manifest is from %v, the earlier one from %v: a failed Put replaced it", m.WrittenAt, oldMan.WrittenAt)
		}
		noTemps(t, dir)
		if names, err := st.List(ctx, ""); err != nil || len(names) != 2 {
			t.Fatalf("after failed Puts the store lists %q, %v; want the shard and the manifest", names, err)
		}
	}
	for store, opts := range faultStoreOptions() {
		for name, tc := range cases {
			t.Run(store+"/"+name, func(t *testing.T) { run(t, opts, tc) })
		}
	}
}

// TestFileStoreInjectedDirSyncFailure: the directory fsync, after the
// rename, fails. The Put reports it (the new object may not survive a
// crash). The store cannot undo a rename, so this failed Put does not
// leave the earlier object as it was, as Store promises: the name holds
// the new version, whole. A restore through the earlier manifest then
// refuses the shard as corrupt (its header is not the one the manifest
// names); it never returns a mix of the two versions.
func TestFileStoreInjectedDirSyncFailure(t *testing.T) {
	for store, opts := range faultStoreOptions() {
		t.Run(store, func(t *testing.T) {
			st, in, dir := newFaultyFileStore(t, opts, 1)
			const job, step = "job", 3
			old, e := faultShard(t, job, step, faultShardBytes, 1)
			saveStep(t, st, job, step, old, e)
			if err := in.Set("fs/tier/sync=1*off->1*error(EIO)"); err != nil { // the file's fsync passes, the directory's fails
				t.Fatal(err)
			}
			name := ShardName(job, step, 0)
			neu, _ := faultShard(t, job, step, faultShardBytes, 2)
			err := st.Put(context.Background(), name, bytes.NewReader(neu), int64(len(neu)))
			if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "fsync directory") {
				t.Fatalf("Put with a failing directory fsync: %v", err)
			}
			in.Clear()
			raw, err := get(t, st, name)
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := restoreStep(st, job, step)
			switch {
			case bytes.Equal(raw, old):
				if err != nil || !bytes.Equal(got, old) {
					t.Fatalf("the old version stayed, yet its restore failed: %v", err)
				}
				t.Log("the old version stayed")
			case bytes.Equal(raw, neu):
				if !errors.Is(err, shm.ErrCorrupt) {
					t.Fatalf("the new version replaced the old one under its manifest; restore: %v, want shm.ErrCorrupt", err)
				}
				t.Logf("the new version is in place, whole; the old manifest's restore refuses it: %v", err)
			default:
				t.Fatal("the object is neither version whole")
			}
			noTemps(t, dir)
		})
	}
}

// TestFileStoreInjectedLyingWritesAreCaught: a torn write (half of it
// lands, the rest of the range keeps what the space reservation left
// there, and the write claims success) and a corrupted write (one bit
// flipped on its way to the disk) both pass unnoticed by Put and by
// WriteManifest's size check. A restore through GetShard refuses the shard
// as corrupt whenever the bytes on disk differ from the shard's, whichever
// of its writes lied; it never returns damaged bytes as the shard.
func TestFileStoreInjectedLyingWritesAreCaught(t *testing.T) {
	writes := (faultShardBytes + faultChunk - 1) / faultChunk
	for store, opts := range faultStoreOptions() {
		for _, kind := range []string{"torn", "corrupt"} {
			t.Run(store+"/"+kind, func(t *testing.T) {
				st, in, dir := newFaultyFileStore(t, opts, 42)
				ctx := context.Background()
				const job = "job"
				for k := range writes { // the k-th write of the shard lies
					step := int64(k + 1)
					shard, e := faultShard(t, job, step, faultShardBytes, byte(k))
					spec := "fs/tier/write=1*" + kind
					if k > 0 {
						spec = fmt.Sprintf("fs/tier/write=%d*off->1*%s", k, kind)
					}
					if err := in.Set(spec); err != nil {
						t.Fatal(err)
					}
					name := ShardName(job, step, 0)
					if err := st.Put(ctx, name, bytes.NewReader(shard), int64(len(shard))); err != nil {
						t.Fatalf("write %d %s: Put: %v (the fault claims success: Put cannot know)", k, kind, err)
					}
					if got := in.Hits()[faultinject.FSTierWrite]; got != uint64(k+1) {
						t.Fatalf("write %d %s: fs/tier/write fired %d times in all, want %d", k, kind, got, k+1)
					}
					in.Clear()
					m := &Manifest{Job: job, Step: step, WorldSize: 1, Shards: []ShardEntry{e}}
					if err := WriteManifest(ctx, st, m); err != nil {
						t.Fatalf("write %d %s: WriteManifest: %v (the size is right: only a checksum can tell)", k, kind, err)
					}
					onDisk, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
					if err != nil {
						t.Fatal(err)
					}
					damaged := !bytes.Equal(onDisk, shard)
					if kind == "torn" && !damaged {
						t.Fatalf("write %d torn: the file holds the whole shard", k)
					}
					got, _, err := restoreStep(st, job, step)
					switch {
					case damaged && !errors.Is(err, shm.ErrCorrupt):
						t.Fatalf("write %d %s: restore of a damaged shard: %v, want an error wrapping shm.ErrCorrupt", k, kind, err)
					case !damaged && (err != nil || !bytes.Equal(got, shard)):
						// A bit flipped in the padding of a direct write's
						// last page is truncated away: the shard is whole.
						t.Fatalf("write %d %s: the bit flipped was cut off, yet the restore failed: %v", k, kind, err)
					case damaged:
						t.Logf("write %d %s: refused: %v", k, kind, err)
					default:
						t.Logf("write %d %s: the flip landed past the end and was truncated; restored whole", k, kind)
					}
				}
			})
		}
	}
}

// TestFileStoreInjectedLyingManifestWrites: a torn manifest write is
// refused by ReadManifest. A manifest written with one bit flipped (each
// seed flips another) is refused, or is read with the flip in a field that
// changes nothing a restore uses, or names a shard the restore then
// refuses: a restore through it never returns anything but the shard's
// bytes.
func TestFileStoreInjectedLyingManifestWrites(t *testing.T) {
	opts := faultStoreOptions()["nvme"]
	ctx := context.Background()
	const job, step = "job", 9

	st, in, _ := newFaultyFileStore(t, opts, 1)
	shard, e := faultShard(t, job, step, faultShardBytes, 9)
	m := saveStep(t, st, job, step, shard, e)
	if err := in.Set("fs/tier/write=1*torn"); err != nil {
		t.Fatal(err)
	}
	if err := WriteManifest(ctx, st, m); err != nil {
		t.Fatalf("torn manifest write: %v (the fault claims success)", err)
	}
	if _, err := ReadManifest(ctx, st, job, step); err == nil || IsNotExist(err) {
		t.Fatalf("ReadManifest of a torn manifest: %v, want it refused", err)
	}

	var refused, harmless, shardRefused int
	for seed := range uint64(64) {
		st, in, _ := newFaultyFileStore(t, opts, seed)
		m := saveStep(t, st, job, step, shard, e)
		if err := in.Set("fs/tier/write=1*corrupt"); err != nil {
			t.Fatal(err)
		}
		if err := WriteManifest(ctx, st, m); err != nil {
			t.Fatalf("seed %d: corrupted manifest write: %v", seed, err)
		}
		if in.Hits()[faultinject.FSTierWrite] != 1 {
			t.Fatalf("seed %d: the manifest write was not corrupted", seed)
		}
		if _, err := ReadManifest(ctx, st, job, step); err != nil {
			if !errors.Is(err, shm.ErrCorrupt) {
				t.Fatalf("seed %d: ReadManifest refused a corrupted manifest with %v, not an ErrCorrupt", seed, err)
			}
			refused++
			continue
		}
		got, _, err := restoreStep(st, job, step)
		switch {
		case err == nil && !bytes.Equal(got, shard):
			t.Fatalf("seed %d: a restore through a corrupted manifest returned bytes that are not the shard", seed)
		case err == nil:
			harmless++
		case errors.Is(err, shm.ErrCorrupt):
			shardRefused++
		default:
			t.Fatalf("seed %d: the restore failed with %v, not an ErrCorrupt", seed, err)
		}
	}
	t.Logf("64 manifests with a flipped bit: %d refused by ReadManifest, %d led to the shard being refused, %d read with a harmless flip",
		refused, shardRefused, harmless)
	if refused == 0 {
		t.Error("no flipped manifest was refused: the injector did not corrupt them")
	}
}
