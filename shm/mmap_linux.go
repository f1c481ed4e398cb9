package shm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Mapping is a segment mapped into this process. Data aliases the segment:
// writes through it land in shared memory with no further copy.
type Mapping struct {
	Data []byte
}

// Map maps size bytes of f, shared, with every page table entry populated up
// front (MAP_POPULATE) so that the first store to each page does not fault.
// The mapping stays valid after f is closed.
func Map(f interface{ Fd() uintptr }, size int64, writable bool) (*Mapping, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shm: cannot map %d bytes", size)
	}
	// A mapping past the end of the file would SIGBUS on access: refuse it.
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("shm: stat before mmap: %w", err)
	}
	if st.Size < size {
		return nil, fmt.Errorf("shm: cannot map %d bytes of a %d-byte file", size, st.Size)
	}
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(size), prot, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("shm: mmap %d bytes: %w", size, err)
	}
	return &Mapping{Data: b}, nil
}

// Close unmaps the segment; Data must not be used afterwards.
func (m *Mapping) Close() error {
	if m.Data == nil {
		return nil
	}
	err := unix.Munmap(m.Data)
	m.Data = nil
	return err
}
