package shm

import (
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// ChecksumAlgo names the checksum in shard metadata.
//
// A tensor's checksum is XXH3-64 (seed 0) of the concatenation of the
// little-endian XXH3-64 hashes of its bytes cut into LeafSize pieces (the
// last may be shorter; an empty tensor has no leaves). Leaves make the sum
// computable by several threads and in the same pass as a copy (copyHash).
const ChecksumAlgo = "xxh3-64-tree-1MiB"

// LeafSize is the leaf size of the checksum tree: large enough that a
// leaf's copy streams past the caches, small enough to spread one tensor
// over several workers.
const LeafSize = 1 << 20

// Sum returns the checksum of b, sequentially.
func Sum(b []byte) uint64 {
	n := NumLeaves(int64(len(b)))
	leaves := make([]uint64, n)
	for i := range leaves {
		leaves[i] = xxh3.Hash(leaf(b, i))
	}
	return rootOf(leaves)
}

// FormatSum renders a checksum as it appears in a shard header.
func FormatSum(s uint64) string { return fmt.Sprintf("%016x", s) }

// NumLeaves is how many leaves hash n bytes: the last may be short.
func NumLeaves(n int64) int { return int((n + LeafSize - 1) / LeafSize) }

func leaf(b []byte, i int) []byte {
	lo := i * LeafSize
	hi := min(lo+LeafSize, len(b))
	return b[lo:hi]
}

// RootOf is the checksum of a piece whose leaf hashes are leaves.
func RootOf(leaves []uint64) uint64 { return rootOf(leaves) }

func rootOf(leaves []uint64) uint64 {
	buf := make([]byte, 8*len(leaves))
	for i, h := range leaves {
		binary.LittleEndian.PutUint64(buf[8*i:], h)
	}
	return xxh3.Hash(buf)
}

// Copy is one unit of work for CopyAndSum: Src is hashed, and copied into
// Dst when Dst is not nil (len(Dst) must equal len(Src)).
type Copy struct {
	Dst, Src []byte
}

// DefaultWorkers is the number of goroutines CopyAndSum uses when asked for
// zero: the copy is bound by memory bandwidth, which two to four cores
// saturate on current servers, and a training process needs its other cores.
func DefaultWorkers() int { return min(runtime.GOMAXPROCS(0), 4) }

// parallelMin is the total size under which CopyAndSum runs inline: below a
// few MiB, starting goroutines costs more than it saves.
const parallelMin = 8 << 20

// CopyAndSum copies every Src into its Dst and returns the checksum of each
// Src, in one pass over the bytes, spread over workers goroutines (0 means
// DefaultWorkers). Callers must not modify any Src or Dst while it runs.
func CopyAndSum(copies []Copy, workers int) []uint64 {
	sizes := make([]int64, len(copies))
	for i, c := range copies {
		if c.Dst != nil && len(c.Dst) != len(c.Src) {
			panic(fmt.Sprintf("shm: copy %d: destination is %d bytes, source %d", i, len(c.Dst), len(c.Src)))
		}
		sizes[i] = int64(len(c.Src))
	}
	return roots(sumLeaves(sizes, workers, func(_, i, j int) uint64 {
		c := copies[i]
		src := leaf(c.Src, j)
		if c.Dst != nil {
			return copyHash(leaf(c.Dst, j), src)
		}
		return xxh3.Hash(src)
	}))
}

// Section is a range of a file.
type Section struct {
	Off, Len int64
}

// SumAt returns the checksum of each section of r, spread over workers
// goroutines (0 means DefaultWorkers): each reads a leaf at a time into a
// buffer of its own, where it is hashed in cache. For a file in shared
// memory this costs a copy out of the page cache but no mapping, whose
// page table (one entry per 4 KiB page) costs more to fill and tear down.
func SumAt(r io.ReaderAt, sections []Section, workers int) ([]uint64, error) {
	leaves, err := LeavesAt(r, sections, workers)
	if err != nil {
		return nil, err
	}
	return roots(leaves), nil
}

// LeavesAt is SumAt that returns each section's leaf hashes (its checksum
// is RootOf them): what lets a reader of a part of a section check only
// the leaves it covers (VerifyRange).
func LeavesAt(r io.ReaderAt, sections []Section, workers int) ([][]uint64, error) {
	if workers <= 0 {
		workers = DefaultWorkers()
	}
	sizes := make([]int64, len(sections))
	for i, sec := range sections {
		sizes[i] = sec.Len
	}
	bufs := make([][]byte, workers)
	var failed atomic.Pointer[error]
	leaves := sumLeaves(sizes, workers, func(w, i, j int) uint64 {
		if failed.Load() != nil {
			return 0
		}
		if bufs[w] == nil {
			bufs[w] = make([]byte, LeafSize)
		}
		off := int64(j) * LeafSize
		b := bufs[w][:min(LeafSize, sections[i].Len-off)]
		if _, err := r.ReadAt(b, sections[i].Off+off); err != nil {
			err = fmt.Errorf("shm: reading %d bytes at %d: %w", len(b), sections[i].Off+off, err)
			failed.CompareAndSwap(nil, &err)
			return 0
		}
		return xxh3.Hash(b)
	})
	if err := failed.Load(); err != nil {
		return nil, *err
	}
	return leaves, nil
}

// sumLeaves returns the leaf hashes of each of len(sizes) pieces of sizes[i]
// bytes, hash(w, i, j) giving the hash of leaf j of piece i on worker w
// (0 <= w < workers): the leaves of every piece are spread over the
// workers as one index space, so that one large tensor is spread over all
// of them as well as many small ones.
func sumLeaves(sizes []int64, workers int, hash func(w, i, j int) uint64) [][]uint64 {
	if workers <= 0 {
		workers = DefaultWorkers()
	}
	starts := make([]int, len(sizes)+1)
	leaves := make([][]uint64, len(sizes))
	var total int64
	for i, n := range sizes {
		leaves[i] = make([]uint64, NumLeaves(n))
		starts[i+1] = starts[i] + len(leaves[i])
		total += n
	}
	nunits := starts[len(sizes)]
	do := func(w, u int) {
		// Find the piece that owns unit u: binary search over starts.
		lo, hi := 0, len(sizes)
		for lo+1 < hi {
			mid := (lo + hi) / 2
			if starts[mid] <= u {
				lo = mid
			} else {
				hi = mid
			}
		}
		for starts[lo+1] <= u { // skip empty pieces sharing the same start
			lo++
		}
		j := u - starts[lo]
		leaves[lo][j] = hash(w, lo, j)
	}
	if workers == 1 || total < parallelMin || nunits < 2 {
		for u := range nunits {
			do(0, u)
		}
	} else {
		var next atomic.Int64
		var wg sync.WaitGroup
		for w := range min(workers, nunits) {
			wg.Go(func() {
				for {
					u := int(next.Add(1) - 1)
					if u >= nunits {
						return
					}
					do(w, u)
				}
			})
		}
		wg.Wait()
	}
	return leaves
}

// roots is each piece's checksum from its leaves.
func roots(leaves [][]uint64) []uint64 {
	sums := make([]uint64, len(leaves))
	for i, l := range leaves {
		sums[i] = rootOf(l)
	}
	return sums
}

// LeafMatches says whether b, one leaf of a tensor's bytes, has the hash h.
func LeafMatches(b []byte, h uint64) bool { return xxh3.Hash(b) == h }

// VerifyRange checks bytes [lo, hi) of a piece b whose leaf hashes are
// leaves and whose checksum is sum: leaves must root to sum (they come
// from whoever hashed the piece before, and are checked here), and every
// leaf [lo, hi) touches is hashed and compared, each once: done records
// the leaves already checked (nil: none), so that several ranges of one
// piece cost each leaf one hash. It returns the bytes hashed, or an error
// wrapping ErrCorrupt.
func VerifyRange(b []byte, lo, hi int64, leaves []uint64, sum uint64, done map[int]bool) (int64, error) {
	if len(leaves) != NumLeaves(int64(len(b))) {
		return 0, corruptf("%d leaf hashes for %d bytes", len(leaves), len(b))
	}
	if rootOf(leaves) != sum {
		return 0, corruptf("leaf hashes do not make the checksum %s", FormatSum(sum))
	}
	var todo []int
	for j := int(lo / LeafSize); int64(j)*LeafSize < hi; j++ {
		if !done[j] {
			todo = append(todo, j)
		}
	}
	// The leaves are hashed as CopyAndSum hashes a piece's: todo[k] is
	// leaf k of one piece of len(todo) leaves.
	got := sumLeaves([]int64{int64(len(todo)) * LeafSize}, 0, func(_, _, k int) uint64 {
		return xxh3.Hash(leaf(b, todo[k]))
	})[0]
	var hashed int64
	for k, j := range todo {
		l := int64(len(leaf(b, j)))
		if got[k] != leaves[j] {
			return hashed, corruptf("leaf %d (bytes %d to %d) does not match its hash", j, int64(j)*LeafSize, int64(j)*LeafSize+l)
		}
		hashed += l
		if done != nil {
			done[j] = true
		}
	}
	return hashed, nil
}

// VerifyCopyRange is VerifyRange that also copies bytes [lo, hi) of b to
// dst (hi-lo bytes) in the same pass, leaf by leaf over workers
// goroutines (0: DefaultWorkers): a whole leaf is copied and hashed in one
// pass (copyHash), part of one copied and the leaf hashed, unless done
// says it was checked before. On an error
// dst holds part of the range, to be written again from another copy.
func VerifyCopyRange(dst, b []byte, lo, hi int64, leaves []uint64, sum uint64, done map[int]bool, workers int) (int64, error) {
	if int64(len(dst)) != hi-lo || lo < 0 || hi > int64(len(b)) || lo > hi {
		panic(fmt.Sprintf("shm: copy of bytes %d to %d of %d into %d", lo, hi, len(b), len(dst)))
	}
	if len(leaves) != NumLeaves(int64(len(b))) {
		return 0, corruptf("%d leaf hashes for %d bytes", len(leaves), len(b))
	}
	if rootOf(leaves) != sum {
		return 0, corruptf("leaf hashes do not make the checksum %s", FormatSum(sum))
	}
	if lo == hi {
		return 0, nil
	}
	first, last := int(lo/LeafSize), int((hi-1)/LeafSize)
	got := sumLeaves([]int64{int64(last-first+1) * LeafSize}, workers, func(_, _, k int) uint64 {
		j := first + k
		l := leaf(b, j)
		from, to := max(lo, int64(j)*LeafSize), min(hi, int64(j)*LeafSize+int64(len(l)))
		whole := to-from == int64(len(l))
		if whole && !done[j] {
			return copyHash(dst[from-lo:to-lo], l)
		}
		copy(dst[from-lo:to-lo], b[from:to])
		if done[j] {
			return leaves[j]
		}
		return xxh3.Hash(l)
	})[0]
	var hashed int64
	for k, h := range got {
		j := first + k
		if done[j] {
			continue
		}
		l := int64(len(leaf(b, j)))
		if h != leaves[j] {
			return hashed, corruptf("leaf %d (bytes %d to %d) does not match its hash", j, int64(j)*LeafSize, int64(j)*LeafSize+l)
		}
		hashed += l
		if done != nil {
			done[j] = true
		}
	}
	return hashed, nil
}
