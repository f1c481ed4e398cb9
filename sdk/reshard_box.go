package sdk

import (
	"fmt"
	"math"
	"slices"

	"rewind.dev/rewind/shm"
)

// piece is one saved tensor placed in its global tensor: a chunk of a
// sharded tensor, or a whole tensor (offsets zero, shape the global shape).
type piece struct {
	rank   uint32
	t      *shm.Tensor
	global []int64
	offs   []int64
	data   []byte   // the piece's bytes in the mapped shard
	leaves []uint64 // its leaf hashes from the agent, nil when not known

	bad    bool         // found corrupt
	whole  bool         // verified whole
	leafOK map[int]bool // the leaves verified so far (shm.VerifyRange)
}

func newPiece(rank uint32, t *shm.Tensor, data []byte) *piece {
	p := &piece{rank: rank, t: t, data: data, global: t.Shape, offs: make([]int64, len(t.Shape))}
	if t.Chunk != nil {
		p.global, p.offs = t.Chunk.GlobalShape, t.Chunk.Offsets
	}
	return p
}

// box is where the piece lies in its global tensor, as a map key: copies
// of one piece (a replicated tensor saved by several ranks) share it.
func (p *piece) box() string { return fmt.Sprint(p.offs, p.t.Shape) }

// intersect returns the box common to (ao, an) and (bo, bn), offsets and
// lengths per dimension, and whether it holds any element.
func intersect(ao, an, bo, bn []int64) (lo, n []int64, ok bool) {
	lo, n = make([]int64, len(ao)), make([]int64, len(ao))
	for d := range ao {
		lo[d] = max(ao[d], bo[d])
		hi := min(ao[d]+an[d], bo[d]+bn[d])
		if hi <= lo[d] {
			return nil, nil, false
		}
		n[d] = hi - lo[d]
	}
	return lo, n, true
}

func volume(n []int64) int64 {
	v := int64(1)
	for _, x := range n {
		v *= x
	}
	return v
}

// strides returns the row-major strides, in elements, of a box of shape n.
func strides(n []int64) []int64 {
	st := make([]int64, len(n))
	s := int64(1)
	for d := len(n) - 1; d >= 0; d-- {
		st[d] = s
		s *= n[d]
	}
	return st
}

// copyBox copies the box (lo, n) of a global tensor from src, holding the
// box (po, pn), to dst, holding the box (so, sn); es is the element size.
// Trailing dimensions that the box spans whole in both are one run.
func copyBox(dst []byte, so, sn []int64, src []byte, po, pn []int64, lo, n []int64, es int64) {
	nd := len(n)
	d := nd - 1
	run := es
	for d >= 0 && n[d] == sn[d] && n[d] == pn[d] {
		run *= n[d]
		d--
	}
	if d >= 0 {
		run *= n[d]
	}
	pst, sst := strides(pn), strides(sn)
	idx := make([]int64, max(d, 0)) // position in dimensions 0..d-1
	for {
		var s, t int64
		for i := 0; i <= d; i++ {
			g := lo[i]
			if i < d {
				g += idx[i]
			}
			s += (g - po[i]) * pst[i]
			t += (g - so[i]) * sst[i]
		}
		copy(dst[t*es:t*es+run], src[s*es:s*es+run])
		i := d - 1
		for ; i >= 0; i-- {
			if idx[i]++; idx[i] < n[i] {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return
		}
	}
}

// oneRun returns where the box (lo, n) lies in src and dst, as copyBox
// would copy it, when that is one contiguous run of bytes in both (rows
// whole in both, as row shards are): the source offset, the destination
// offset and the length.
func oneRun(so, sn, po, pn, lo, n []int64, es int64) (src, dst, length int64, ok bool) {
	d := len(n) - 1
	length = es
	for d >= 0 && n[d] == sn[d] && n[d] == pn[d] {
		length *= n[d]
		d--
	}
	if d > 0 {
		return 0, 0, 0, false
	}
	if d == 0 {
		length *= n[0]
	}
	pst, sst := strides(pn), strides(sn)
	for i := range n {
		src += (lo[i] - po[i]) * pst[i]
		dst += (lo[i] - so[i]) * sst[i]
	}
	return src * es, dst * es, length, true
}

// checkSlice reports whether sl is a well-formed request.
func checkSlice(sl *Slice) error {
	if len(sl.Offsets) != len(sl.Lengths) {
		return fmt.Errorf("slice of %q: %d offsets, %d lengths", sl.Name, len(sl.Offsets), len(sl.Lengths))
	}
	for d := range sl.Offsets {
		if sl.Offsets[d] < 0 || sl.Lengths[d] < 0 {
			return fmt.Errorf("slice of %q: negative offset or length %v/%v", sl.Name, sl.Offsets, sl.Lengths)
		}
		if sl.Offsets[d] > math.MaxInt64-sl.Lengths[d] { // its end would wrap, and pass for inside the shape
			return fmt.Errorf("slice of %q: %v+%v is outside any global shape", sl.Name, sl.Offsets, sl.Lengths)
		}
	}
	n, err := sl.DType.NumBytes(sl.Lengths)
	if err != nil {
		return fmt.Errorf("slice of %q: %v", sl.Name, err)
	}
	if int64(len(sl.Data)) != n {
		return fmt.Errorf("slice of %q: %s%v needs %d bytes, buffer has %d", sl.Name, sl.DType, sl.Lengths, n, len(sl.Data))
	}
	return nil
}

// cover returns, for each distinct box of the pieces that overlap sl, the
// copies of that box (lowest rank first) and the overlap. It fails unless
// the pieces have sl's element type and global shape and the boxes cover
// sl exactly once: ErrInvalid for a slice of another rank or element type
// or outside the shape.
func cover(sl *Slice, pieces []*piece) (groups [][]*piece, err error) {
	if len(sl.Lengths) != len(pieces[0].global) {
		return nil, fmt.Errorf("%w: tensor %q has %d dimensions, slice %d", ErrInvalid, sl.Name, len(pieces[0].global), len(sl.Lengths))
	}
	for d := range sl.Lengths {
		if sl.Offsets[d]+sl.Lengths[d] > pieces[0].global[d] {
			return nil, fmt.Errorf("%w: tensor %q: slice %v+%v is outside global shape %v", ErrInvalid, sl.Name, sl.Offsets, sl.Lengths, pieces[0].global)
		}
	}
	byBox := map[string]int{}
	var covered int64
	for _, p := range pieces {
		if !slices.Equal(p.global, pieces[0].global) || p.t.DType != pieces[0].t.DType {
			return nil, fmt.Errorf("tensor %q: rank %d holds a piece of %s of global shape %v, rank %d of %s of %v",
				sl.Name, p.rank, p.t.DType, p.global, pieces[0].rank, pieces[0].t.DType, pieces[0].global)
		}
		if p.t.DType != sl.DType {
			return nil, fmt.Errorf("%w: tensor %q: rank %d holds %s, asked for %s", ErrInvalid, sl.Name, p.rank, p.t.DType, sl.DType)
		}
		if _, _, ok := intersect(p.offs, p.t.Shape, sl.Offsets, sl.Lengths); !ok {
			continue
		}
		if g, ok := byBox[p.box()]; ok {
			groups[g] = append(groups[g], p)
			continue
		}
		for _, g := range groups {
			if _, _, ok := intersect(p.offs, p.t.Shape, g[0].offs, g[0].t.Shape); ok {
				return nil, fmt.Errorf("tensor %q: pieces of ranks %d and %d overlap without being copies", sl.Name, p.rank, g[0].rank)
			}
		}
		byBox[p.box()] = len(groups)
		groups = append(groups, []*piece{p})
		_, n, _ := intersect(p.offs, p.t.Shape, sl.Offsets, sl.Lengths)
		covered += volume(n)
	}
	if covered != volume(sl.Lengths) {
		return nil, fmt.Errorf("tensor %q: the saved pieces cover %d of the slice's %d elements", sl.Name, covered, volume(sl.Lengths))
	}
	return groups, nil
}

// byteRange is the range of a piece's bytes (row-major, element size es)
// that holds the box (lo, n) of its global tensor: from its first element
// to its last, the rows between included.
func (p *piece) byteRange(lo, n []int64, es int64) (int64, int64) {
	first, last := int64(0), int64(0)
	for d := range lo {
		first = first*p.t.Shape[d] + (lo[d] - p.offs[d])
		last = last*p.t.Shape[d] + (lo[d] + n[d] - 1 - p.offs[d])
	}
	return first * es, (last + 1) * es
}
