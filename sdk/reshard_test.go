package sdk_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// global is a tensor of the model as a whole, and how the ranks of the
// saving gang hold it: split by rows (rows[r] rows to rank r), or whole
// on the ranks in copies.
type global struct {
	name   string
	dtype  shm.DType
	shape  []int64
	rows   []int64
	copies []uint32
	data   []byte
}

// model is saved at world size 4: row-sharded 2-D tensors with uneven
// splits (one piece over 1 MiB), a replicated bias saved by ranks 0 and 2,
// and a scalar saved by rank 0 alone.
func model(seed uint64) []*global {
	gs := []*global{
		{name: "w", dtype: shm.F32, shape: []int64{10, 6}, rows: []int64{4, 3, 2, 1}},
		{name: "big", dtype: shm.U8, shape: []int64{2600, 1024}, rows: []int64{1100, 700, 500, 300}},
		{name: "emb", dtype: shm.BF16, shape: []int64{7, 5}, rows: []int64{2, 2, 2, 1}},
		{name: "bias", dtype: shm.F32, shape: []int64{13}, copies: []uint32{0, 2}},
		{name: "count", dtype: shm.I64, shape: []int64{}, copies: []uint32{0}},
	}
	for i, g := range gs {
		n, _ := g.dtype.NumBytes(g.shape)
		g.data = pattern(seed+uint64(i), int(n))
	}
	return gs
}

// rowBytes is the size of one row of g.
func (g *global) rowBytes() int64 {
	n, _ := g.dtype.NumBytes(g.shape[1:])
	return n
}

// saveSharded saves gs at step as ranks 0..3 of a world of 4.
func saveSharded(t *testing.T, c *sdk.Client, job string, step int64, gs []*global, ranks int) {
	t.Helper()
	for r := range uint32(ranks) {
		var ts []sdk.Tensor
		for _, g := range gs {
			if g.rows == nil {
				for _, cr := range g.copies {
					if cr == r {
						ts = append(ts, sdk.Tensor{Name: g.name, DType: g.dtype, Shape: g.shape, Data: g.data})
					}
				}
				continue
			}
			var off int64
			for _, n := range g.rows[:r] {
				off += n
			}
			rb := g.rowBytes()
			ts = append(ts, sdk.Tensor{Name: g.name, DType: g.dtype, Shape: []int64{g.rows[r], g.shape[1]},
				Data:  g.data[off*rb : (off+g.rows[r])*rb],
				Chunk: &shm.Chunk{GlobalShape: g.shape, Offsets: []int64{off, 0}}})
		}
		s := session(t, c, job, r, 4)
		if err := s.Save(ctxT(t), step, ts, map[string]any{"rank": r}); err != nil {
			t.Fatal(err)
		}
	}
}

// span is part p of n of length total, the first parts one longer.
func span(total int64, p, n int) (off, length int64) {
	q, rem := total/int64(n), total%int64(n)
	off = int64(p)*q + min(int64(p), rem)
	length = q
	if int64(p) < rem {
		length++
	}
	return off, length
}

// layoutFor is rank j's share at world size m: 2-D tensors in m/cols row
// groups by cols column groups (columns split unevenly where they must),
// the rest whole.
func layoutFor(gs []*global, j, m, cols int) sdk.Layout {
	var l sdk.Layout
	for _, g := range gs {
		sl := sdk.Slice{Name: g.name, DType: g.dtype, Offsets: make([]int64, len(g.shape)), Lengths: append([]int64{}, g.shape...)}
		if len(g.shape) == 2 {
			sl.Offsets[0], sl.Lengths[0] = span(g.shape[0], j/cols, m/cols)
			sl.Offsets[1], sl.Lengths[1] = span(g.shape[1], j%cols, cols)
		}
		n, _ := g.dtype.NumBytes(sl.Lengths)
		sl.Data = make([]byte, n)
		l.Slices = append(l.Slices, sl)
	}
	return l
}

// place writes a restored slice into the assembled global tensor, element
// row by element row.
func place(dst []byte, g *global, sl sdk.Slice) {
	if len(g.shape) < 2 {
		copy(dst, sl.Data)
		return
	}
	es, rb := g.dtype.Size(), g.rowBytes()
	w := sl.Lengths[1] * es
	for r := range sl.Lengths[0] {
		at := (sl.Offsets[0]+r)*rb + sl.Offsets[1]*es
		copy(dst[at:at+w], sl.Data[r*w:(r+1)*w])
	}
}

// TestReshardRestore: a checkpoint saved at world size 4 restores at 3
// (row slices) and at 6 (row and column slices, uneven), the global
// tensors assembled from the new ranks bit-identical to the saved ones,
// from the newest step every rank saved; the objects are rank 0's unless
// the layout names another rank.
func TestReshardRestore(t *testing.T) {
	c, _ := start(t, nil)
	saveSharded(t, c, "rs", 3, model(100), 4)
	gs := model(200)
	saveSharded(t, c, "rs", 7, gs, 4)
	saveSharded(t, c, "rs", 9, model(300), 3) // rank 3 never saved step 9
	for _, tc := range []struct{ m, cols int }{{3, 1}, {6, 2}} {
		assembled := make([][]byte, len(gs))
		for i, g := range gs {
			assembled[i] = make([]byte, len(g.data))
		}
		for j := range tc.m {
			s := session(t, c, "rs", uint32(j), uint32(tc.m))
			l := layoutFor(gs, j, tc.m, tc.cols)
			res, err := s.RestoreInto(ctxT(t), l)
			if err != nil {
				t.Fatalf("M=%d rank %d: %v", tc.m, j, err)
			}
			if res.Step != 7 || res.SavedWorldSize != 4 || string(res.Objects) != `{"rank":0}` {
				t.Fatalf("M=%d rank %d: restored step %d of world size %d, objects %s; want step 7, 4, rank 0's",
					tc.m, j, res.Step, res.SavedWorldSize, res.Objects)
			}
			for i, sl := range l.Slices {
				place(assembled[i], gs[i], sl)
			}
		}
		for i, g := range gs {
			if !bytes.Equal(assembled[i], g.data) {
				t.Fatalf("M=%d: tensor %q assembled from the new ranks differs from the saved one", tc.m, g.name)
			}
		}
	}
	s := session(t, c, "rs", 1, 2)
	res, err := s.RestoreStepInto(ctxT(t), 7, sdk.Layout{ObjectsRank: 2})
	if err != nil || res.Step != 7 || string(res.Objects) != `{"rank":2}` {
		t.Fatalf("step 7 with rank 2's objects: %+v, %v", res, err)
	}
}

// pieceAt returns where tensor name of rank's shard of step lies.
func pieceAt(t *testing.T, c *sdk.Client, job string, rank uint32, step int64, name string) (string, int64) {
	t.Helper()
	shards, err := c.List(ctxT(t), job)
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		if sh.Rank == rank && sh.Step == step {
			b, err := os.ReadFile(sh.Path)
			if err != nil {
				t.Fatal(err)
			}
			h, err := shm.DecodeBytes(b)
			if err != nil {
				t.Fatal(err)
			}
			return sh.Path, h.DataStart + h.Tensor(name).Begin
		}
	}
	t.Fatalf("no shard of %s rank %d step %d", job, rank, step)
	return "", 0
}

// TestReshardCorruptPiece: a flipped byte in a piece with no other copy
// is refused with ErrCorrupt naming the rank, tensor and step; a flipped
// byte in one copy of a replicated tensor falls back to the other copy.
func TestReshardCorruptPiece(t *testing.T) {
	c, _ := start(t, func(cfg *agent.Config) { cfg.VerifyAfterCommit = false })
	gs := model(7)
	saveSharded(t, c, "bad", 5, gs, 4)
	saveSharded(t, c, "copy", 5, gs, 4)

	path, off := pieceAt(t, c, "bad", 1, 5, "w")
	testcluster.Flip(t, path, off+3)
	// New rank 0 of 3 reads rows 0-3 of w, all in old rank 0's piece: the
	// flipped byte of rank 1's is not read.
	if _, err := session(t, c, "bad", 0, 3).RestoreInto(ctxT(t), layoutFor(gs, 0, 3, 1)); err != nil {
		t.Fatalf("restore of slices clear of the flipped piece: %v", err)
	}
	_, err := session(t, c, "bad", 1, 3).RestoreInto(ctxT(t), layoutFor(gs, 1, 3, 1))
	if !errors.Is(err, sdk.ErrCorrupt) {
		t.Fatalf("restore over a flipped byte: %v, want ErrCorrupt", err)
	}
	for _, want := range []string{`tensor "w"`, "rank 1", "step 5"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not name %s", err, want)
		}
	}

	path, off = pieceAt(t, c, "copy", 0, 5, "bias")
	testcluster.Flip(t, path, off)
	l := layoutFor(gs, 1, 3, 1)
	if _, err := session(t, c, "copy", 1, 3).RestoreInto(ctxT(t), l); err != nil {
		t.Fatalf("restore with one good copy of the bias left: %v", err)
	}
	if !bytes.Equal(l.Slices[3].Data, gs[3].data) {
		t.Fatal("the bias restored from the other copy differs from the saved one")
	}
	shards, _ := c.List(ctxT(t), "copy")
	for _, sh := range shards {
		if sh.Rank == 0 && sh.Step == 5 && sh.Problem == "" {
			t.Fatalf("rank 0's corrupt shard was not reported: %+v", sh)
		}
	}
}

// TestReshardRefusesBadLayouts: a slice outside the tensor, of another
// element type, of a tensor nobody saved, or with a short buffer is
// refused as invalid or not found, before any byte is copied.
func TestReshardRefusesBadLayouts(t *testing.T) {
	c, _ := start(t, nil)
	gs := model(9)
	saveSharded(t, c, "lay", 1, gs, 4)
	s := session(t, c, "lay", 0, 2)
	for name, tc := range map[string]struct {
		sl   sdk.Slice
		want error
	}{
		"outside":     {sdk.Slice{Name: "w", DType: shm.F32, Offsets: []int64{8, 0}, Lengths: []int64{3, 6}, Data: make([]byte, 72)}, nil},
		"dtype":       {sdk.Slice{Name: "w", DType: shm.I32, Offsets: []int64{0, 0}, Lengths: []int64{1, 6}, Data: make([]byte, 24)}, nil},
		"unknown":     {sdk.Slice{Name: "nope", DType: shm.F32, Offsets: []int64{0}, Lengths: []int64{1}, Data: make([]byte, 4)}, sdk.ErrNotFound},
		"short":       {sdk.Slice{Name: "w", DType: shm.F32, Offsets: []int64{0, 0}, Lengths: []int64{1, 6}, Data: make([]byte, 23)}, sdk.ErrInvalid},
		"dimensions":  {sdk.Slice{Name: "w", DType: shm.F32, Offsets: []int64{0}, Lengths: []int64{6}, Data: make([]byte, 24)}, nil},
		"bad objects": {sdk.Slice{Name: "bias", DType: shm.F32, Offsets: []int64{0}, Lengths: []int64{13}, Data: make([]byte, 52)}, sdk.ErrInvalid},
	} {
		l := sdk.Layout{Slices: []sdk.Slice{tc.sl}}
		if name == "bad objects" {
			l.ObjectsRank = 4
		}
		_, err := s.RestoreInto(ctxT(t), l)
		if err == nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Fatalf("%s: %v, want an error (%v)", name, err, tc.want)
		}
	}
	var o map[string]any
	res, err := s.RestoreInto(ctxT(t), sdk.Layout{})
	if err != nil || json.Unmarshal(res.Objects, &o) != nil || o["rank"] != 0.0 {
		t.Fatalf("empty layout: %+v, %v", res, err)
	}
}

// TestReshardStepOfTwoGangs: an agent alone holds step 6 of two gangs,
// neither whole: ranks 1 to 3 of the old one at world size 4 (its rank 0
// died in that save) and rank 0 of a new one at world size 2. Every rank
// of 0 to 3 has a shard of step 6, but no world size's ranks are all
// there: the restore picks step 5, whole at world size 4.
func TestReshardStepOfTwoGangs(t *testing.T) {
	c, _ := start(t, nil)
	gs := model(5)
	saveSharded(t, c, "two", 5, gs, 4)
	other := []sdk.Tensor{{Name: "w", DType: shm.F32, Shape: []int64{2}, Data: make([]byte, 8)}}
	for r := uint32(1); r < 4; r++ {
		if err := session(t, c, "two", r, 4).Save(ctxT(t), 6, other, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := session(t, c, "two", 0, 2).Save(ctxT(t), 6, other, nil); err != nil {
		t.Fatal(err)
	}
	l := layoutFor(gs, 0, 2, 1)
	res, err := session(t, c, "two", 0, 2).RestoreInto(ctxT(t), l)
	if err != nil {
		t.Fatal(err)
	}
	if res.Step != 5 || res.SavedWorldSize != 4 {
		t.Fatalf("restored step %d of world size %d; want step 5 of world size 4", res.Step, res.SavedWorldSize)
	}
}
