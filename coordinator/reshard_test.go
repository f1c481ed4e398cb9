package coordinator_test

import (
	"bytes"
	"testing"

	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// TestReshardAcrossNodes: a step saved by 4 ranks on two nodes (rank r
// on node r%2) restores at world size 3 on node 0 alone, with the job's
// latest consistent step: the agent fetches the shards of ranks 1 and 3
// from node 1, and the global tensor assembled from the three new ranks
// is the saved one, bit for bit.
func TestReshardAcrossNodes(t *testing.T) {
	cl := newCluster(t, 2)
	rows := []int64{4, 3, 2, 1}
	global := make([]byte, 10*6*4) // F32 [10, 6]
	for i := range global {
		global[i] = byte(i*7 + 3)
	}
	const rb = 6 * 4
	var off int64
	for r := range uint32(4) {
		s, err := cl.clients[r%2].Session("rsx", r, 4)
		if err != nil {
			t.Fatal(err)
		}
		ts := []sdk.Tensor{{Name: "w", DType: shm.F32, Shape: []int64{rows[r], 6}, Data: global[off*rb : (off+rows[r])*rb],
			Chunk: &shm.Chunk{GlobalShape: []int64{10, 6}, Offsets: []int64{off, 0}}}}
		if err := s.Save(ctxT(t), 4, ts, map[string]uint32{"rank": r}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		off += rows[r]
	}
	cl.waitLatest("rsx", 4)
	got := make([]byte, len(global))
	off = 0
	for j, n := range []int64{4, 3, 3} {
		s, err := cl.clients[0].Session("rsx", uint32(j), 3)
		if err != nil {
			t.Fatal(err)
		}
		sl := sdk.Slice{Name: "w", DType: shm.F32, Offsets: []int64{off, 0}, Lengths: []int64{n, 6}, Data: got[off*rb : (off+n)*rb]}
		res, err := s.RestoreInto(ctxT(t), sdk.Layout{Slices: []sdk.Slice{sl}})
		s.Close()
		if err != nil {
			t.Fatalf("new rank %d of 3: %v", j, err)
		}
		if res.Step != 4 || res.SavedWorldSize != 4 || string(res.Objects) != `{"rank":0}` {
			t.Fatalf("new rank %d: %+v", j, res)
		}
		off += n
	}
	if !bytes.Equal(got, global) {
		t.Fatal("the tensor assembled from the new ranks differs from the saved one")
	}
	held := map[uint32]bool{}
	shards, err := cl.clients[0].List(ctxT(t), "rsx")
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		held[sh.Rank] = true
	}
	if !held[1] || !held[3] {
		t.Fatalf("node 0 holds ranks %v: the shards of ranks 1 and 3 were not fetched there", held)
	}
}
