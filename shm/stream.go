package shm

import "github.com/zeebo/xxh3"

// StreamCheck verifies a shard while its bytes arrive in file order (a
// copy from a peer): each leaf of the checksum tree is hashed as soon as
// its last byte is in place, while it is still in cache, so that no second
// pass over the shard is needed. Check gives the same verdict as Verify.
//
// A StreamCheck is used by one goroutine; the caller must not change bytes
// already reported with Arrived (a leaf hashed is not hashed again).
type StreamCheck struct {
	h      *Header
	b      []byte
	have   int64 // b[:have] has arrived
	t      int   // the tensor whose leaves are being hashed
	leaf   int   // its next leaf
	leaves [][]uint64
}

// NewStreamCheck starts checking the shard whose bytes will arrive in b;
// h is its header, already decoded from b and checked by the caller, and
// len(b) must be h.Size (Check fails otherwise).
func (h *Header) NewStreamCheck(b []byte) *StreamCheck {
	s := &StreamCheck{h: h, b: b, leaves: make([][]uint64, len(h.Tensors))}
	for i, t := range h.Tensors {
		s.leaves[i] = make([]uint64, 0, NumLeaves(t.Len()))
	}
	return s
}

// Arrived records that b[:n] is in place and hashes every leaf it
// completes. n never goes back.
func (s *StreamCheck) Arrived(n int64) {
	s.have = max(s.have, min(n, int64(len(s.b))))
	for s.t < len(s.h.Tensors) {
		t := &s.h.Tensors[s.t]
		lo := s.h.DataStart + t.Begin + int64(s.leaf)*LeafSize
		hi := min(lo+LeafSize, s.h.DataStart+t.End)
		if lo >= hi { // the tensor's leaves are done (or it has none)
			s.t, s.leaf = s.t+1, 0
			continue
		}
		if hi > s.have {
			return
		}
		s.leaves[s.t] = append(s.leaves[s.t], xxh3.Hash(s.b[lo:hi]))
		s.leaf++
	}
}

// Check compares every tensor's checksum with the header, once the whole
// shard has arrived; an error wraps ErrCorrupt.
func (s *StreamCheck) Check() error {
	if int64(len(s.b)) != s.h.Size {
		return corruptf("file is %d bytes, header says %d", len(s.b), s.h.Size)
	}
	if s.have != s.h.Size || s.t != len(s.h.Tensors) {
		return corruptf("%d of %d bytes arrived", s.have, s.h.Size)
	}
	sums := make([]uint64, len(s.leaves))
	for i, l := range s.leaves {
		sums[i] = rootOf(l)
	}
	return s.h.check(sums)
}
