// Package vfs is the file-system interface under rewind's local file I/O
// (the agent's shared-memory segments, the NVMe and parallel filesystem
// tiers), and its implementation on the operating system, Default.
// faultinject wraps an FS to fail or corrupt any operation by name, as
// pebble's errorfs wraps pebble's vfs.FS.
package vfs

import (
	"io"
	"os"
)

// FS is a file system: the shared-memory root under the agent's segments,
// or the directory of a file tier. All of their file I/O goes through it,
// so that faultinject can wrap it and fail or corrupt any operation by
// name, as pebble's errorfs does.
//
// Implementations must be safe for concurrent use; a File is used by one
// goroutine at a time.
type FS interface {
	MkdirAll(dir string, perm os.FileMode) error
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	Rename(oldpath, newpath string) error
	Remove(name string) error
	RemoveAll(name string) error
	ReadDir(name string) ([]os.DirEntry, error)
	Stat(name string) (os.FileInfo, error)
	// Statfs reports on the file system holding path.
	Statfs(path string) (FSStat, error)
}

// File is an open file of an FS.
type File interface {
	io.ReaderAt
	io.WriterAt
	io.Closer
	Stat() (os.FileInfo, error)
	Truncate(size int64) error
	// Allocate reserves [off, off+length) so that later writes, and stores
	// through a mapping, cannot fail for lack of space. It grows the file.
	Allocate(off, length int64) error
	// Fd is the descriptor to map the file with; valid until Close.
	Fd() uintptr
	// Sync flushes the file's data and metadata to stable storage.
	Sync() error
}

// FSStat describes the file system under a path.
type FSStat struct {
	// Type names the file system as mount(8) does ("tmpfs", "ext4",
	// "xfs", "overlay", "proc", ...); one without a name here reads
	// "an unknown file system (magic 0x...)".
	Type   string
	Magic  int64  // the magic number statfs(2) reports
	Tmpfs  bool   // memory-backed: tmpfs or hugetlbfs
	Pseudo bool   // a kernel view (proc, sysfs, cgroup, ...): it stores nothing
	Size   uint64 // total bytes
	Free   uint64 // bytes available to an unprivileged writer
}

// Default is the FS of the operating system.
var Default FS = osFS{}

type osFS struct{}

func (osFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }
func (osFS) Rename(o, n string) error                    { return os.Rename(o, n) }
func (osFS) Remove(name string) error                    { return os.Remove(name) }
func (osFS) RemoveAll(name string) error                 { return os.RemoveAll(name) }
func (osFS) ReadDir(name string) ([]os.DirEntry, error)  { return os.ReadDir(name) }
func (osFS) Stat(name string) (os.FileInfo, error)       { return os.Stat(name) }

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

type osFile struct{ *os.File }

var _ FS = osFS{}
var _ File = osFile{}
