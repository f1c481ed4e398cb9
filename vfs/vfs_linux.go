package vfs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

func (osFS) Statfs(path string) (FSStat, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return FSStat{}, fmt.Errorf("vfs: statfs %s: %w", path, err)
	}
	magic := int64(uint32(st.Type)) // f_type is a signed word on some architectures
	s := FSStat{
		Magic: magic,
		Size:  st.Blocks * uint64(st.Bsize),
		Free:  st.Bavail * uint64(st.Bsize),
		Tmpfs: magic == unix.TMPFS_MAGIC || magic == unix.HUGETLBFS_MAGIC,
	}
	if n, ok := fsNames[magic]; ok {
		s.Type, s.Pseudo = n.name, n.pseudo
	} else {
		s.Type = fmt.Sprintf("an unknown file system (magic 0x%x)", magic)
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
