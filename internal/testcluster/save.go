package testcluster

import (
	"testing"

	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// SaveRowPieces saves step of job through c at world size ranks: global,
// a U8 tensor "w" of rows rows of width bytes, split into ranks row
// pieces, rank r saving the r-th with its chunk record (what a resharding
// restore reads).
func SaveRowPieces(tb testing.TB, c *sdk.Client, job string, step int64, global []byte, rows, width int64, ranks uint32) {
	tb.Helper()
	for r := range ranks {
		s, err := c.Session(job, r, ranks)
		if err != nil {
			tb.Fatal(err)
		}
		off, n := int64(r)*rows/int64(ranks), int64(r+1)*rows/int64(ranks)-int64(r)*rows/int64(ranks)
		ts := []sdk.Tensor{{Name: "w", DType: shm.U8, Shape: []int64{n, width}, Data: global[off*width : (off+n)*width],
			Chunk: &shm.Chunk{GlobalShape: []int64{rows, width}, Offsets: []int64{off, 0}}}}
		if err := s.Save(tb.Context(), step, ts, nil); err != nil {
			tb.Fatal(err)
		}
		s.Close()
	}
}
