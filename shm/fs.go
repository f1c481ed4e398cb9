package shm

import (
	"io"
	"os"
)

// FS is the file system under a shared-memory root. All of the agent's file
// I/O on segments goes through it, so that faultinject can wrap it and fail
// or corrupt any operation by name, as pebble's errorfs does.
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
	Type  string // "tmpfs", "hugetlbfs" or the magic number in hex
	Tmpfs bool   // memory-backed: tmpfs or hugetlbfs
	Size  uint64 // total bytes
	Free  uint64 // bytes available to an unprivileged writer
}

// OSFS is the FS of the operating system.
var OSFS FS = osFS{}

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
