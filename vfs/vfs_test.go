package vfs_test

import (
	"os"
	"path/filepath"
	"testing"

	"rewind.dev/rewind/vfs"
)

// TestDefault: the operating system's FS creates, allocates, renames and
// removes a file, and Statfs tells tmpfs from a disk.
func TestDefault(t *testing.T) {
	dir := t.TempDir()
	fs := vfs.Default
	if err := fs.MkdirAll(filepath.Join(dir, "a", "b"), 0o700); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, "a", "b", "f")
	f, err := fs.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Allocate(0, 1<<20); err != nil {
		t.Fatal(err)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != 1<<20 {
		t.Fatalf("after Allocate: size %v, %v; want 1 MiB", fi.Size(), err)
	}
	if _, err := f.WriteAt([]byte("x"), 42); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename(name, name+".2"); err != nil {
		t.Fatal(err)
	}
	if ents, err := fs.ReadDir(filepath.Dir(name)); err != nil || len(ents) != 1 || ents[0].Name() != "f.2" {
		t.Fatalf("ReadDir = %v, %v; want [f.2]", ents, err)
	}
	if err := fs.Remove(name + ".2"); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Stat(name + ".2"); !os.IsNotExist(err) {
		t.Fatalf("Stat after Remove: %v", err)
	}
	if err := fs.RemoveAll(filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
	st, err := fs.Statfs(dir)
	if err != nil || st.Size == 0 || st.Free > st.Size {
		t.Fatalf("Statfs(%s) = %+v, %v", dir, st, err)
	}
	if shm, err := fs.Statfs("/dev/shm"); err == nil && !shm.Tmpfs {
		t.Errorf("Statfs(/dev/shm) = %+v: not tmpfs", shm)
	}
	if _, err := fs.Statfs(filepath.Join(dir, "missing")); err == nil {
		t.Error("Statfs of a missing path succeeded")
	}
}
