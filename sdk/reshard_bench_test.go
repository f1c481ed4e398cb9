package sdk_test

import (
	"testing"

	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// BenchmarkReshardRestore compares restoring a 64 MiB tensor saved by 4
// ranks (row pieces of 16 MiB) at world size 4 (each rank its own shard,
// Restore) and at 3 (RestoreInto, each new rank's rows from two or three
// old pieces, checking only the leaves it reads); bytes per op are the
// whole tensor's.
func BenchmarkReshardRestore(b *testing.B) {
	c, _ := start(b, nil)
	const rows, width = 64, 1 << 20
	global := pattern(1, rows*width)
	testcluster.SaveRowPieces(b, c, "bench", 1, global, rows, width, 4)
	// The agent verifies each shard after its commit and keeps the leaf
	// hashes, which a restore of part of a piece checks its reads against:
	// measured once that is done, as a recovery after a save finds it.
	waitVerified(b, c, "bench")
	b.Run("same-world-size-4", func(b *testing.B) {
		b.SetBytes(rows * width)
		for b.Loop() {
			for r := range uint32(4) {
				s, _ := c.Session("bench", r, 4)
				if _, err := s.RestoreStep(b.Context(), 1); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("reshard-to-3", func(b *testing.B) {
		b.SetBytes(rows * width)
		for b.Loop() {
			for j := range 3 {
				off, n := span(rows, j, 3)
				s, _ := c.Session("bench", uint32(j), 3)
				sl := sdk.Slice{Name: "w", DType: shm.U8, Offsets: []int64{off, 0}, Lengths: []int64{n, width}, Data: make([]byte, n*width)}
				if _, err := s.RestoreStepInto(b.Context(), 1, sdk.Layout{Slices: []sdk.Slice{sl}}); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
