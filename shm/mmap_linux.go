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
	return mapFile(f, size, writable, unix.MAP_POPULATE)
}

// MapLazy is Map without populating the page table: each page is mapped
// (and, in a new segment, zeroed) when first touched, or by Prefault.
func MapLazy(f interface{ Fd() uintptr }, size int64, writable bool) (*Mapping, error) {
	return mapFile(f, size, writable, 0)
}

func mapFile(f interface{ Fd() uintptr }, size int64, writable bool, flags int) (*Mapping, error) {
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
	b, err := unix.Mmap(int(f.Fd()), 0, int(size), prot, unix.MAP_SHARED|flags)
	if err != nil {
		return nil, fmt.Errorf("shm: mmap %d bytes: %w", size, err)
	}
	return &Mapping{Data: b}, nil
}

// prefaultPiece is how much Prefault faults in per call, between looks at
// whether to stop.
const prefaultPiece = 16 << 20

// Prefault faults the pages of a writable lazy mapping in for writing
// (MADV_POPULATE_WRITE: a new segment's pages are zeroed and mapped), from
// the first, until all are or done is closed. Run beside a writer slower
// than the kernel's page setup (a socket receive) it keeps ahead of it, so
// that the writer finds its pages ready while the setup runs on another
// core; a writer that catches up faults its own pages. It stops early on
// an error (no MADV_POPULATE_WRITE before Linux 5.14). The caller must not
// unmap m before Prefault returns.
func (m *Mapping) Prefault(done <-chan struct{}) {
	for off := 0; off < len(m.Data); off += prefaultPiece {
		select {
		case <-done:
			return
		default:
		}
		if err := unix.Madvise(m.Data[off:min(off+prefaultPiece, len(m.Data))], unix.MADV_POPULATE_WRITE); err != nil {
			return
		}
	}
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
