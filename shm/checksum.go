package shm

import (
	"encoding/binary"
	"fmt"
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
// computable by several threads and in the same pass as a copy: each leaf is
// hashed right after it is copied, while it is still in cache.
const ChecksumAlgo = "xxh3-64-tree-1MiB"

// LeafSize is the leaf size of the checksum tree. One MiB is large enough
// that copy() streams with non-temporal stores and small enough that the
// leaf is still in cache when it is hashed.
const LeafSize = 1 << 20

// Sum returns the checksum of b, sequentially.
func Sum(b []byte) uint64 {
	n := numLeaves(int64(len(b)))
	leaves := make([]uint64, n)
	for i := range leaves {
		leaves[i] = xxh3.Hash(leaf(b, i))
	}
	return rootOf(leaves)
}

// FormatSum renders a checksum as it appears in a shard header.
func FormatSum(s uint64) string { return fmt.Sprintf("%016x", s) }

func numLeaves(n int64) int { return int((n + LeafSize - 1) / LeafSize) }

func leaf(b []byte, i int) []byte {
	lo := i * LeafSize
	hi := min(lo+LeafSize, len(b))
	return b[lo:hi]
}

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
	if workers <= 0 {
		workers = DefaultWorkers()
	}
	// Flatten the leaves of every copy into one index space so that one
	// large tensor is spread over all workers as well as many small ones.
	starts := make([]int, len(copies)+1)
	leaves := make([][]uint64, len(copies))
	var total int64
	for i, c := range copies {
		if c.Dst != nil && len(c.Dst) != len(c.Src) {
			panic(fmt.Sprintf("shm: copy %d: destination is %d bytes, source %d", i, len(c.Dst), len(c.Src)))
		}
		n := numLeaves(int64(len(c.Src)))
		leaves[i] = make([]uint64, n)
		starts[i+1] = starts[i] + n
		total += int64(len(c.Src))
	}
	nunits := starts[len(copies)]
	do := func(u int) {
		// Find the copy that owns unit u: binary search over starts.
		lo, hi := 0, len(copies)
		for lo+1 < hi {
			mid := (lo + hi) / 2
			if starts[mid] <= u {
				lo = mid
			} else {
				hi = mid
			}
		}
		for starts[lo+1] <= u { // skip empty copies sharing the same start
			lo++
		}
		j := u - starts[lo]
		c := copies[lo]
		src := leaf(c.Src, j)
		if c.Dst != nil {
			copy(leaf(c.Dst, j), src)
		}
		leaves[lo][j] = xxh3.Hash(src)
	}
	if workers == 1 || total < parallelMin || nunits < 2 {
		for u := range nunits {
			do(u)
		}
	} else {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range min(workers, nunits) {
			wg.Go(func() {
				for {
					u := int(next.Add(1) - 1)
					if u >= nunits {
						return
					}
					do(u)
				}
			})
		}
		wg.Wait()
	}
	sums := make([]uint64, len(copies))
	for i := range copies {
		sums[i] = rootOf(leaves[i])
	}
	return sums
}
