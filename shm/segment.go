package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/vfs"
)

// NoSpaceError reports that shared memory cannot hold a segment.
type NoSpaceError struct {
	Path   string
	Asked  uint64 // bytes the segment needs beyond what it already holds
	Free   uint64 // bytes free on the file system
	Mount  string // the root the segment lives under
	FSSize uint64
	Cause  error // the allocation's own error, when it failed although the space looked free
}

func (e *NoSpaceError) Unwrap() error { return e.Cause }

func (e *NoSpaceError) Error() string {
	if e.Free >= e.Asked && e.Cause != nil {
		return fmt.Sprintf("shm: segment %s needs %s more and %s looks free on %s (%s in all), but reserving it failed: %v; "+
			"a memory limit of the container or pod, or another writer, holds the space",
			e.Path, units.Bytes(e.Asked), units.Bytes(e.Free), e.Mount, units.Bytes(e.FSSize), e.Cause)
	}
	return fmt.Sprintf("shm: segment %s needs %s more but only %s is free on %s (%s in all); enlarge it (docker run --shm-size, an emptyDir with medium Memory and a sizeLimit) or lower the checkpoint size",
		e.Path, units.Bytes(e.Asked), units.Bytes(e.Free), e.Mount, units.Bytes(e.FSSize))
}

// Segments allocates segment files under a root.
type Segments struct {
	FS       vfs.FS
	Paths    Paths
	FileMode os.FileMode // mode of segment files; directories add x bits
}

func (s *Segments) dirMode() os.FileMode {
	m := s.FileMode | 0o700
	if m&0o060 != 0 {
		m |= 0o010
	}
	if m&0o006 != 0 {
		m |= 0o001
	}
	return m
}

// Reserve makes the segment at path exactly size bytes, its space allocated.
// A segment that already has the size is left as it is (a warm slot): its
// pages stay resident and mapped by its writers. It reports whether the file
// was created or resized. When space runs short it returns a *NoSpaceError
// and the file's size and contents are unchanged.
func (s *Segments) Reserve(path string, size int64) (resized bool, err error) {
	resized, _, err = s.ReserveID(path, size)
	return resized, err
}

// ReserveID is Reserve; it also returns the file's inode number (0 where
// the file system does not say), which tells a segment from another that
// replaced it at the same path.
func (s *Segments) ReserveID(path string, size int64) (resized bool, id uint64, err error) {
	if err := s.FS.MkdirAll(filepath.Dir(path), s.dirMode()); err != nil {
		return false, 0, fmt.Errorf("shm: creating %s: %w", filepath.Dir(path), err)
	}
	f, err := s.FS.OpenFile(path, os.O_RDWR|os.O_CREATE, s.FileMode)
	if err != nil {
		return false, 0, fmt.Errorf("shm: opening segment: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, 0, fmt.Errorf("shm: stat segment: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id = st.Ino
	}
	cur := fi.Size()
	switch {
	case cur == size:
		return false, id, nil
	case cur > size:
		if err := f.Truncate(size); err != nil {
			return false, 0, fmt.Errorf("shm: shrinking segment %s to %d bytes: %w", path, size, err)
		}
		return true, id, nil
	}
	st, err := s.FS.Statfs(s.Paths.Root)
	if err != nil {
		return false, 0, err
	}
	need := uint64(size - cur)
	nospace := &NoSpaceError{Path: path, Asked: need, Free: st.Free, Mount: s.Paths.Root, FSSize: st.Size}
	if need > st.Free {
		return false, 0, nospace
	}
	if err := f.Allocate(0, size); err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			// The space went between the check and fallocate: report
			// what is free now, not what was free before.
			if st, serr := s.FS.Statfs(s.Paths.Root); serr == nil {
				nospace.Free, nospace.FSSize = st.Free, st.Size
			}
			nospace.Cause = err
			return false, 0, nospace
		}
		return false, 0, fmt.Errorf("shm: allocating %s for segment %s: %w", units.Bytes(uint64(size)), path, err)
	}
	return true, id, nil
}
