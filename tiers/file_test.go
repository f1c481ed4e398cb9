package tiers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"rewind.dev/rewind/vfs"
)

// buffer is an io.WriterAt over fixed memory, as a segment is.
type buffer struct{ b []byte }

func (w *buffer) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || int(off)+len(p) > len(w.b) {
		return 0, fmt.Errorf("write of %d bytes at %d past the %d-byte buffer", len(p), off, len(w.b))
	}
	return copy(w.b[off:], p), nil
}

// get reads a whole object the way a restore does: size, then Get.
func get(t *testing.T, s Store, name string) ([]byte, error) {
	t.Helper()
	n, err := s.Size(context.Background(), name)
	if err != nil {
		return nil, err
	}
	w := &buffer{b: make([]byte, n)}
	m, err := s.Get(context.Background(), name, w)
	if err == nil && m != n {
		err = fmt.Errorf("get returned %d bytes, size said %d", m, n)
	}
	return w.b, err
}

func data(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

type fileCase struct {
	opts FileOptions
	dir  string // "" means a t.TempDir on local disk
}

func TestFileStoreRoundTrip(t *testing.T) {
	small := NVMeOptions()
	small.ChunkBytes, small.DirectMinBytes = 1<<16, 1<<17
	pfs := PFSOptions()
	pfs.ChunkBytes = 1 << 16
	cases := map[string]fileCase{
		"nvme, direct":    {opts: small},
		"nvme, buffered":  {opts: func() FileOptions { o := small; o.Direct = false; return o }()},
		"pfs, 8 writers":  {opts: pfs},
		"direct on tmpfs": {opts: small, dir: "/dev/shm"}, // falls back to buffered
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) { runFileRoundTrip(t, tc) })
	}
}

func runFileRoundTrip(t *testing.T, tc fileCase) {
	dir := t.TempDir()
	if tc.dir != "" {
		d, err := os.MkdirTemp(tc.dir, "rewind-tiers-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	s, err := NewFileStore(dir, tc.opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, n := range []int{0, 1, 4095, 4096, 1<<17 + 3, 1<<20 + 12345} {
		name := fmt.Sprintf("job/step-%d/rank-0.safetensors", i)
		want := data(n, byte(i))
		if err := s.Put(ctx, name, bytes.NewReader(want), int64(n)); err != nil {
			t.Fatalf("put %d bytes: %v", n, err)
		}
		if sz, err := s.Size(ctx, name); err != nil || sz != int64(n) {
			t.Fatalf("size of %d-byte object: %d, %v", n, sz, err)
		}
		if got, err := get(t, s, name); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("get of %d-byte object: %v, equal %v", n, err, bytes.Equal(got, want))
		}
	}
	names, err := s.List(ctx, "job/step-1")
	if err != nil || len(names) != 1 || names[0] != "job/step-1/rank-0.safetensors" {
		t.Fatalf("list: %v %v", names, err)
	}
	all, _ := s.List(ctx, "")
	if len(all) != 6 {
		t.Fatalf("list of everything: %v", all)
	}
	if err := s.Delete(ctx, "job/step-1/rank-0.safetensors"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "job/step-1/rank-0.safetensors"); err != nil {
		t.Fatalf("deleting a missing object: %v", err)
	}
	if _, err := s.Size(ctx, "job/step-1/rank-0.safetensors"); !IsNotExist(err) {
		t.Fatalf("size of a deleted object: %v, want IsNotExist", err)
	}
	for _, bad := range []string{"", "/abs", "../x", "a/../../b", "a//b"} {
		if err := s.Put(ctx, bad, bytes.NewReader(nil), 0); err == nil {
			t.Errorf("put of name %q accepted", bad)
		}
	}
}

// failingReader fails after limit bytes, like a source that goes away.
type failingReader struct {
	r     *bytes.Reader
	limit int64
}

func (f failingReader) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > f.limit {
		return 0, errors.New("source gone")
	}
	return f.r.ReadAt(p, off)
}

func noTemps(t *testing.T, dir string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if strings.HasSuffix(p, tmpSuffix) {
			t.Fatalf("temporary file left behind: %s", p)
		}
		return nil
	})
}

func TestFileStoreFailedPutKeepsOldObject(t *testing.T) {
	dir := t.TempDir()
	o := NVMeOptions()
	o.ChunkBytes = 1 << 16
	s, err := NewFileStore(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	old := data(300_000, 1)
	if err := s.Put(ctx, "a/b", bytes.NewReader(old), int64(len(old))); err != nil {
		t.Fatal(err)
	}
	neu := data(300_000, 2)
	err = s.Put(ctx, "a/b", failingReader{bytes.NewReader(neu), 200_000}, int64(len(neu)))
	if err == nil || !strings.Contains(err.Error(), "source gone") {
		t.Fatalf("put from a failing source: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Put(cctx, "a/b", bytes.NewReader(neu), int64(len(neu))); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled put: %v", err)
	}
	if got, err := get(t, s, "a/b"); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("old object after failed puts: %v, intact %v", err, bytes.Equal(got, old))
	}
	noTemps(t, dir)
}

// TestFileStoreFullDisk runs on a small tmpfs of its own: a Put larger
// than the free space fails with ENOSPC before writing, and leaves the
// earlier object and no temporary file.
func TestFileStoreFullDisk(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("cannot mount a small tmpfs here (%v); the fault-injection test covers ENOSPC", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	s, err := NewFileStore(dir, NVMeOptions())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	old := data(1<<20, 3)
	if err := s.Put(ctx, "x", bytes.NewReader(old), int64(len(old))); err != nil {
		t.Fatal(err)
	}
	big := data(8<<20, 4)
	err = s.Put(ctx, "x", bytes.NewReader(big), int64(len(big)))
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "reserving 8.0 MiB") {
		t.Fatalf("put larger than the disk: %v, want ENOSPC naming the size", err)
	}
	if got, err := get(t, s, "x"); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("old object after ENOSPC: %v", err)
	}
	noTemps(t, dir)
}

// faultFS fails one kind of operation, as faultinject will.
type faultFS struct {
	vfs.FS
	syncErr error
}

type faultFile struct {
	vfs.File
	syncErr error
}

func (f faultFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return faultFile{file, f.syncErr}, nil
}

func (f faultFile) Sync() error {
	if f.syncErr != nil {
		return f.syncErr
	}
	return f.File.Sync()
}

func TestFileStoreFsyncErrorIsNotSuccess(t *testing.T) {
	dir := t.TempDir()
	o := NVMeOptions()
	o.FS = faultFS{FS: vfs.Default, syncErr: syscall.EIO}
	s, err := NewFileStore(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Put(context.Background(), "a", bytes.NewReader(data(1000, 5)), 1000)
	if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "fsync") {
		t.Fatalf("put with a failing fsync: %v", err)
	}
	if _, err := s.Size(context.Background(), "a"); !IsNotExist(err) {
		t.Fatalf("an object whose fsync failed is visible: %v", err)
	}
	noTemps(t, dir)
}
