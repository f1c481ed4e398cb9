package faultinject

import (
	"context"
	"io"
	"os"
	"unsafe"

	"rewind.dev/rewind/vfs"
)

// FS wraps a file system so that the points of domain fire on its
// operations, as pebble's errorfs does: domain "shm" (the agent's
// segments) fires fs/shm/allocate; domain "tier" (the NVMe and parallel
// filesystem tiers) fires fs/tier/write, fs/tier/sync and fs/tier/rename.
// A nil Injector returns inner itself.
func (in *Injector) FS(inner vfs.FS, domain string) vfs.FS {
	if in == nil {
		return inner
	}
	if f, ok := inner.(*faultyFS); ok && f.in == in && f.domain == domain {
		return f // wrapped already
	}
	return &faultyFS{FS: inner, in: in, domain: domain}
}

type faultyFS struct {
	vfs.FS
	in     *Injector
	domain string
}

var _ vfs.FS = (*faultyFS)(nil)

func (f *faultyFS) Rename(oldpath, newpath string) error {
	if f.domain == "tier" {
		if err := f.in.Check(context.Background(), FSTierRename); err != nil {
			return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
		}
	}
	return f.FS.Rename(oldpath, newpath)
}

func (f *faultyFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultyFile{File: file, fs: f, name: name}, nil
}

type faultyFile struct {
	vfs.File
	fs   *faultyFS
	name string
}

func (f *faultyFile) Allocate(off, length int64) error {
	if f.fs.domain == "shm" {
		if err := f.fs.in.Check(context.Background(), FSShmAllocate); err != nil {
			return &os.PathError{Op: "fallocate", Path: f.name, Err: err}
		}
	}
	return f.File.Allocate(off, length)
}

func (f *faultyFile) Sync() error {
	if f.fs.domain == "tier" {
		if err := f.fs.in.Check(context.Background(), FSTierSync); err != nil {
			return &os.PathError{Op: "fsync", Path: f.name, Err: err}
		}
	}
	return f.File.Sync()
}

// tornAlign keeps a cut-off write a multiple of the O_DIRECT alignment.
const tornAlign = 4096

func (f *faultyFile) WriteAt(p []byte, off int64) (int, error) {
	if f.fs.domain != "tier" {
		return f.File.WriteAt(p, off)
	}
	fault := f.fs.in.Eval(context.Background(), FSTierWrite)
	switch fault.Kind {
	case KindError:
		return 0, &os.PathError{Op: "write", Path: f.name, Err: fault.Err()}
	case KindShort, KindTorn:
		half := len(p) / 2 / tornAlign * tornAlign
		n, err := f.File.WriteAt(p[:half], off)
		if err != nil {
			return n, err
		}
		if fault.Kind == KindTorn {
			return len(p), nil // claims all of it: only a checksum can tell
		}
		return n, &os.PathError{Op: "write", Path: f.name, Err: io.ErrShortWrite}
	case KindCorrupt:
		if len(p) == 0 {
			break
		}
		q := alignedCopy(p) // the file may be open with O_DIRECT
		Flip(q, fault)
		return f.File.WriteAt(q, off)
	}
	return f.File.WriteAt(p, off)
}

// alignedCopy copies p into a buffer aligned for O_DIRECT.
func alignedCopy(p []byte) []byte {
	buf := make([]byte, len(p)+tornAlign)
	off := 0
	if r := int(uintptr(unsafe.Pointer(&buf[0])) % tornAlign); r != 0 {
		off = tornAlign - r
	}
	q := buf[off : off+len(p)]
	copy(q, p)
	return q
}

// Flip flips one bit of one byte of b, chosen by the fault's draw, and
// returns the byte's offset (-1 for an empty b).
func Flip(b []byte, f Fault) int {
	if len(b) == 0 {
		return -1
	}
	i := int(f.Draw() % uint64(len(b)))
	b[i] ^= 1 << (f.Draw() >> 61)
	return i
}
