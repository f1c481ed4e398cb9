package shm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

func (osFS) Statfs(path string) (FSStat, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return FSStat{}, fmt.Errorf("shm: statfs %s: %w", path, err)
	}
	s := FSStat{
		Size: st.Blocks * uint64(st.Bsize),
		Free: st.Bavail * uint64(st.Bsize),
	}
	switch int64(st.Type) {
	case unix.TMPFS_MAGIC:
		s.Type, s.Tmpfs = "tmpfs", true
	case unix.HUGETLBFS_MAGIC:
		s.Type, s.Tmpfs = "hugetlbfs", true
	default:
		s.Type = fmt.Sprintf("0x%x", st.Type)
	}
	return s, nil
}

func (f osFile) Allocate(off, length int64) error {
	for {
		err := unix.Fallocate(int(f.File.Fd()), 0, off, length)
		if err != unix.EINTR {
			return err
		}
	}
}
