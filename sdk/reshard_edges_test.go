package sdk_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// ndGlobal is a global tensor of any rank, and the boxes (offsets,
// shape) each saving rank holds of it: none, one, or the whole tensor
// saved without a chunk record (whole).
type ndGlobal struct {
	name  string
	dtype shm.DType
	shape []int64
	split int      // the dimension the ranks split, -1: saved whole by the ranks in whole
	parts []int64  // lengths along split, one per saving rank
	data  []byte   // row-major, the global tensor
	whole []uint32 // ranks that save it whole (no chunk), when split is -1
}

// ndBox extracts the box (offs, lens) of g, row-major.
func (g *ndGlobal) ndBox(offs, lens []int64) []byte {
	es := g.dtype.Size()
	n, _ := g.dtype.NumBytes(lens)
	out := make([]byte, 0, n)
	if n == 0 {
		return out
	}
	gst := make([]int64, len(g.shape))
	s := int64(1)
	for d := len(g.shape) - 1; d >= 0; d-- {
		gst[d] = s
		s *= g.shape[d]
	}
	idx := make([]int64, len(lens))
	for {
		var at int64
		for d := range idx {
			at += (offs[d] + idx[d]) * gst[d]
		}
		out = append(out, g.data[at*es:(at+1)*es]...)
		d := len(idx) - 1
		for ; d >= 0; d-- {
			if idx[d]++; idx[d] < lens[d] {
				break
			}
			idx[d] = 0
		}
		if d < 0 {
			return out
		}
	}
}

// pieceOf returns what rank r saves of g.
func (g *ndGlobal) pieceOf(r int) (sdk.Tensor, bool) {
	if g.split < 0 {
		for _, w := range g.whole {
			if int(w) == r {
				return sdk.Tensor{Name: g.name, DType: g.dtype, Shape: g.shape, Data: g.data}, true
			}
		}
		return sdk.Tensor{}, false
	}
	offs := make([]int64, len(g.shape))
	for _, n := range g.parts[:r] {
		offs[g.split] += n
	}
	lens := append([]int64{}, g.shape...)
	lens[g.split] = g.parts[r]
	return sdk.Tensor{Name: g.name, DType: g.dtype, Shape: lens, Data: g.ndBox(offs, lens),
		Chunk: &shm.Chunk{GlobalShape: g.shape, Offsets: offs}}, true
}

func saveND(t *testing.T, c *sdk.Client, job string, step int64, gs []*ndGlobal, ranks int) {
	t.Helper()
	for r := range ranks {
		var ts []sdk.Tensor
		for _, g := range gs {
			if p, ok := g.pieceOf(r); ok {
				ts = append(ts, p)
			}
		}
		if err := session(t, c, job, uint32(r), uint32(ranks)).Save(ctxT(t), step, ts, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func ndModel(seed uint64) []*ndGlobal {
	gs := []*ndGlobal{
		// 3-D, split on the middle dimension unevenly, one rank empty, the
		// pieces 1.3 to 1.8 MiB (leaf boundaries inside rows).
		{name: "attn", dtype: shm.BF16, shape: []int64{3, 700, 1000}, split: 1, parts: []int64{300, 0, 250, 150}},
		// 4-D, split on the last dimension.
		{name: "conv", dtype: shm.F64, shape: []int64{2, 3, 5, 7}, split: 3, parts: []int64{2, 2, 3, 0}},
		// int8 split on the inner dimension of 3, odd sizes.
		{name: "q", dtype: shm.I8, shape: []int64{5, 1201, 777}, split: 2, parts: []int64{100, 333, 1, 343}},
		{name: "mask", dtype: shm.Bool, shape: []int64{9, 4, 3}, split: 0, parts: []int64{1, 5, 0, 3}},
		{name: "scalar", dtype: shm.F64, shape: []int64{}, split: -1, whole: []uint32{1, 3}},
		// Row pieces of 1.6 to 2.3 MiB, 2-byte elements, rows of odd size.
		{name: "rows", dtype: shm.U16, shape: []int64{2600, 1023}, split: 0, parts: []int64{1100, 800, 0, 700}},
		{name: "empty", dtype: shm.F32, shape: []int64{4, 0, 3}, split: 0, parts: []int64{1, 1, 1, 1}},
	}
	for i, g := range gs {
		n, _ := g.dtype.NumBytes(g.shape)
		g.data = pattern(seed+uint64(i), int(n))
	}
	return gs
}

// ndSlices are boxes of g a new rank may ask for: straddling pieces,
// inside one, whole, thin, single elements.
func ndSlices(g *ndGlobal) [][2][]int64 {
	full := func() [2][]int64 { return [2][]int64{make([]int64, len(g.shape)), append([]int64{}, g.shape...)} }
	out := [][2][]int64{full()}
	if len(g.shape) == 0 {
		return out
	}
	for k := range 6 {
		b := full()
		for d, n := range g.shape {
			if n == 0 {
				continue
			}
			o := (int64(k*7+d*13) % n)
			l := max(1, (n-o)/int64(k+1))
			if k == 5 {
				l = 1
			}
			b[0][d], b[1][d] = o, l
		}
		out = append(out, b)
		rows := full() // rows only: one run where the pieces are row pieces
		rows[0][0], rows[1][0] = b[0][0], b[1][0]
		out = append(out, rows)
	}
	return out
}

func ndLayout(gs []*ndGlobal) (sdk.Layout, [][]byte) {
	var l sdk.Layout
	var want [][]byte
	for _, g := range gs {
		for _, b := range ndSlices(g) {
			n, _ := g.dtype.NumBytes(b[1])
			l.Slices = append(l.Slices, sdk.Slice{Name: g.name, DType: g.dtype, Offsets: b[0], Lengths: b[1], Data: bytes.Repeat([]byte{0xAB}, int(n))})
			want = append(want, g.ndBox(b[0], b[1]))
		}
	}
	return l, want
}

// TestReshardNDBoxes: boxes of 3-D and 4-D tensors sharded on inner
// dimensions, unevenly with empty pieces, of 1-, 2- and 8-byte element
// types, a 0-d tensor and one with a zero-sized dimension, restore
// bit-exact, with the agent's leaf hashes and without.
func TestReshardNDBoxes(t *testing.T) {
	for _, verified := range []bool{false, true} {
		t.Run(fmt.Sprint("verified=", verified), func(t *testing.T) {
			c, _ := start(t, func(cfg *agent.Config) { cfg.VerifyAfterCommit = verified })
			gs := ndModel(41)
			saveND(t, c, "nd", 2, gs, 4)
			if verified {
				waitVerified(t, c, "nd")
			}
			l, want := ndLayout(gs)
			if _, err := session(t, c, "nd", 0, 3).RestoreInto(ctxT(t), l); err != nil {
				t.Fatal(err)
			}
			for i, sl := range l.Slices {
				if !bytes.Equal(sl.Data, want[i]) {
					t.Fatalf("slice %d: %q %v+%v: restored bytes differ", i, sl.Name, sl.Offsets, sl.Lengths)
				}
			}
		})
	}
}

// TestReshardBadLayoutKinds: a slice the checkpoint cannot serve is
// refused with an error naming the tensor, of the kind a caller can test
// for, as the Python SDK's are: a box outside the global shape (one whose
// end overflows int64 too, even an empty one), of another element type or
// rank, is invalid; a box the saved pieces do not cover fails too (not
// ErrNotFound, which a caller takes for "no checkpoint: start afresh").
func TestReshardBadLayoutKinds(t *testing.T) {
	c, _ := start(t, nil)
	// Rows 0-8 of "gap" are saved, row 9 by no rank.
	gs := []*ndGlobal{{name: "gap", dtype: shm.F32, shape: []int64{10, 6}, split: 0, parts: []int64{4, 3, 2}}}
	gs[0].data = pattern(5, 240)
	saveND(t, c, "kinds", 1, gs, 3)
	s := session(t, c, "kinds", 0, 2)
	for name, tc := range map[string]struct {
		offs, lens []int64
		dt         shm.DType
		want       error
	}{
		"outside":          {[]int64{8, 0}, []int64{3, 6}, shm.F32, sdk.ErrInvalid},
		"overflow":         {[]int64{math.MaxInt64 - 1, 0}, []int64{2, 6}, shm.F32, sdk.ErrInvalid},
		"overflow, empty":  {[]int64{0, math.MaxInt64}, []int64{0, 1}, shm.F32, sdk.ErrInvalid},
		"dtype":            {[]int64{0, 0}, []int64{1, 6}, shm.I32, sdk.ErrInvalid},
		"same size dtype":  {[]int64{0, 0}, []int64{1, 6}, shm.U32, sdk.ErrInvalid},
		"dimensions":       {[]int64{0}, []int64{6}, shm.F32, sdk.ErrInvalid},
		"not saved (gap)":  {[]int64{8, 0}, []int64{2, 6}, shm.F32, errAny},
		"no such 0-d one":  {nil, nil, shm.F32, sdk.ErrInvalid},
		"empty, in bounds": {[]int64{10, 0}, []int64{0, 6}, shm.F32, nil},
	} {
		n, _ := tc.dt.NumBytes(tc.lens)
		l := sdk.Layout{Slices: []sdk.Slice{{Name: "gap", DType: tc.dt, Offsets: tc.offs, Lengths: tc.lens, Data: make([]byte, n)}}}
		_, err := s.RestoreInto(ctxT(t), l)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if err == nil || tc.want != errAny && !errors.Is(err, tc.want) || errors.Is(err, sdk.ErrNotFound) || !strings.Contains(err.Error(), `"gap"`) {
			t.Errorf("%s: %v; want an error of kind %v naming the tensor", name, err, tc.want)
		}
	}
}

// TestReshardCorruptCopyND: a flipped byte in one copy of a
// replicated 3-D tensor, in a leaf that a box reads (strided, rows copied
// as one run, or one run in both), is found, and the box's bytes come
// from the other copy, with the agent's leaf hashes and without.
func TestReshardCorruptCopyND(t *testing.T) {
	g := &ndGlobal{name: "rep", dtype: shm.BF16, shape: []int64{4, 600, 700}, split: -1, whole: []uint32{0, 2}}
	g.data = pattern(77, 4*600*700*2)
	const flipAt = 2<<20 + 4321 // in leaf 2: element [2 301 36]
	boxes := [][2][]int64{
		{{1, 300, 30}, {2, 3, 10}}, // strided, over the flipped element
		{{2, 300, 0}, {1, 3, 700}}, // three whole rows over it
		{{1, 0, 0}, {2, 600, 700}}, // one run in piece and slice over it
		{{0, 0, 0}, {4, 600, 700}}, // the whole tensor
	}
	for _, verified := range []bool{false, true} {
		t.Run(fmt.Sprint("verified=", verified), func(t *testing.T) {
			c, _ := start(t, func(cfg *agent.Config) { cfg.VerifyAfterCommit = verified })
			for i, b := range boxes {
				job := fmt.Sprintf("cc%d", i) // a shard reported corrupt is not served again: one job a box
				saveND(t, c, job, 4, []*ndGlobal{g}, 4)
				if verified {
					waitVerified(t, c, job)
				}
				path, off := pieceAt(t, c, job, 0, 4, "rep")
				testcluster.Flip(t, path, off+flipAt)
				n, _ := g.dtype.NumBytes(b[1])
				l := sdk.Layout{Slices: []sdk.Slice{{Name: "rep", DType: g.dtype, Offsets: b[0], Lengths: b[1], Data: make([]byte, n)}}}
				if _, err := session(t, c, job, 1, 2).RestoreInto(ctxT(t), l); err != nil {
					t.Fatalf("box %v+%v with a good copy left: %v", b[0], b[1], err)
				}
				if !bytes.Equal(l.Slices[0].Data, g.ndBox(b[0], b[1])) {
					t.Fatalf("box %v+%v: restored bytes differ from the saved ones", b[0], b[1])
				}
				shards, err := c.List(ctxT(t), job)
				if err != nil {
					t.Fatal(err)
				}
				for _, sh := range shards {
					if sh.Rank == 0 && sh.Problem == "" {
						t.Fatalf("box %v+%v: the flipped byte of rank 0's copy was not found", b[0], b[1])
					}
				}
			}
		})
	}
}

// TestReshardConcurrentRanks: the ranks of a new gang restore at
// once from one agent, each its own boxes, bit-exact.
func TestReshardConcurrentRanks(t *testing.T) {
	c, _ := start(t, nil)
	gs := ndModel(91)
	saveND(t, c, "conc", 6, gs, 4)
	waitVerified(t, c, "conc")
	const m = 5
	var wg sync.WaitGroup
	errs := make([]error, m)
	for j := range m {
		s := session(t, c, "conc", uint32(j), m)
		wg.Go(func() {
			l, want := ndLayout(gs)
			if _, err := s.RestoreInto(ctxT(t), l); err != nil {
				errs[j] = err
				return
			}
			for i, sl := range l.Slices {
				if !bytes.Equal(sl.Data, want[i]) {
					errs[j] = fmt.Errorf("slice %d %q %v+%v: restored bytes differ", i, sl.Name, sl.Offsets, sl.Lengths)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestReshardReleasesOnErrors: restores that fail (a tensor nobody
// saved, a dtype mismatch, a corrupt piece with no other copy) release
// every lease: the step can then be deleted on every rank.
func TestReshardReleasesOnErrors(t *testing.T) {
	c, _ := start(t, func(cfg *agent.Config) { cfg.VerifyAfterCommit = false })
	gs := ndModel(3)
	saveND(t, c, "leak", 8, gs, 4)
	path, off := pieceAt(t, c, "leak", 3, 8, "q")
	testcluster.Flip(t, path, off+10)
	s := session(t, c, "leak", 0, 2)
	for _, sl := range []sdk.Slice{
		{Name: "nope", DType: shm.F32, Offsets: []int64{0}, Lengths: []int64{1}, Data: make([]byte, 4)},
		{Name: "conv", DType: shm.F32, Offsets: []int64{0, 0, 0, 0}, Lengths: []int64{1, 1, 1, 1}, Data: make([]byte, 4)},
		{Name: "q", DType: shm.I8, Offsets: []int64{0, 0, 0}, Lengths: []int64{5, 1201, 777}, Data: make([]byte, 5*1201*777)},
	} {
		if _, err := s.RestoreInto(ctxT(t), sdk.Layout{Slices: []sdk.Slice{sl}}); err == nil {
			t.Fatalf("restore of %q: no error", sl.Name)
		}
	}
	resp, err := c.API().Delete(ctxT(t), &agentpb.DeleteRequest{Job: "leak", AllRanks: true, Step: 8})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Deleted != 4 {
		t.Fatalf("deleted %d shards of step 8, want 4: a failed restore kept a lease", resp.Deleted)
	}
}

// nodes starts a coordinator and n agents on loopback, each with its
// data path (mod, when not nil, changes agent i's configuration), and
// returns a client of each agent.
func nodes(t *testing.T, n int, mod func(i int, cfg *agent.Config)) []*sdk.Client {
	ccfg := testcluster.CoordinatorConfig(t)
	ccfg.Replicas = 0
	coord := testcluster.StartCoordinator(t, ccfg)
	var cs []*sdk.Client
	for i := range n {
		cfg := testcluster.AgentConfig(t)
		addr := testcluster.FreeAddr(t)
		cfg.Node, cfg.CoordinatorAddr, cfg.ListenAddr, cfg.AdvertiseAddr = fmt.Sprintf("node-%d", i), coord.Addr, addr, addr
		cfg.Logger = testcluster.Discard()
		if mod != nil {
			mod(i, &cfg)
		}
		testcluster.StartAgent(t, cfg)
		cs = append(cs, testcluster.Dial(t, cfg.Socket))
	}
	api := testcluster.DialCoordinator(t, coord.Addr)
	wait.ForNil(t, 10*time.Second, "the agents' order streams", func() error {
		resp, err := api.TierStatus(ctxT(t), &coordpb.TierStatusRequest{})
		if err == nil && len(resp.Nodes) < n {
			err = fmt.Errorf("%d open", len(resp.Nodes))
		}
		return err
	})
	return cs
}

// TestReshardNDAcrossNodes: the N-D boxes restore bit-exact on a
// node that holds none of the shards (every shard opened partially, its
// ranges fetched from the two nodes that saved them), fetching no more
// than the shards hold; and so when one copy of a replicated tensor has a
// flipped byte in a leaf the boxes read.
func TestReshardNDAcrossNodes(t *testing.T) {
	cs := nodes(t, 3, nil)
	gs := ndModel(123)
	gs = append(gs, &ndGlobal{name: "rep", dtype: shm.F32, shape: []int64{3, 300, 700}, split: -1, whole: []uint32{0, 1}})
	gs[len(gs)-1].data = pattern(9, 3*300*700*4)
	var total int64
	for r := range 4 {
		var ts []sdk.Tensor
		for _, g := range gs {
			if p, ok := g.pieceOf(r); ok {
				ts = append(ts, p)
				total += int64(len(p.Data))
			}
		}
		if err := session(t, cs[r%2], "x", uint32(r), 4).Save(ctxT(t), 5, ts, nil); err != nil {
			t.Fatal(err)
		}
	}
	waitVerified(t, cs[0], "x")
	waitVerified(t, cs[1], "x")
	wait.ForNil(t, 10*time.Second, "step 5 consistent", func() error {
		_, err := session(t, cs[2], "x", 0, 3).RestoreInto(ctxT(t), sdk.Layout{})
		return err
	})
	// On node-0: ranks 0 and 2 from its memory, 1 and 3 in ranges.
	l, want := ndLayout(gs)
	if _, err := session(t, cs[0], "x", 2, 3).RestoreInto(ctxT(t), l); err != nil {
		t.Fatal(err)
	}
	for i, sl := range l.Slices {
		if !bytes.Equal(sl.Data, want[i]) {
			t.Fatalf("node-0: slice %d %q %v+%v: restored bytes differ", i, sl.Name, sl.Offsets, sl.Lengths)
		}
	}
	path, off := pieceAt(t, cs[0], "x", 0, 5, "rep")
	testcluster.Flip(t, path, off+(1<<20)+77) // rank 0's copy, leaf 1
	l, want = ndLayout(gs)
	res, err := session(t, cs[2], "x", 1, 3).RestoreInto(ctxT(t), l)
	if err != nil {
		t.Fatal(err)
	}
	for i, sl := range l.Slices {
		if !bytes.Equal(sl.Data, want[i]) {
			t.Fatalf("slice %d %q %v+%v: restored bytes differ", i, sl.Name, sl.Offsets, sl.Lengths)
		}
	}
	t.Logf("fetched %d of %d bytes", res.Fetched, total)
	if res.Step != 5 || res.Fetched == 0 || res.Fetched > total+1<<20 {
		t.Fatalf("restored step %d, fetched %d bytes of %d saved", res.Step, res.Fetched, total)
	}
}

// TestReshardFetchFailureIsNotCorruption: where the agent cannot
// fetch the ranges a restore needs for a reason that is no fault of the
// bytes (its memory budget is spent), the restore fails with that reason
// (ErrResourceExhausted, to retry or make room), not ErrCorrupt: that
// says the checkpoint's bytes are bad.
func TestReshardFetchFailureIsNotCorruption(t *testing.T) {
	cs := nodes(t, 3, func(i int, cfg *agent.Config) {
		if i == 2 {
			cfg.BudgetBytes = 256 << 10 // the headers fit, no 1 MiB leaf does
		}
	})
	g := &ndGlobal{name: "w", dtype: shm.U8, shape: []int64{4096, 1024}, split: 0, parts: []int64{1024, 1024, 1024, 1024}}
	g.data = pattern(8, 4096*1024)
	for r := range 4 {
		p, _ := g.pieceOf(r)
		if err := session(t, cs[r%2], "fx", uint32(r), 4).Save(ctxT(t), 2, []sdk.Tensor{p}, nil); err != nil {
			t.Fatal(err)
		}
	}
	l := sdk.Layout{Slices: []sdk.Slice{{Name: "w", DType: shm.U8, Offsets: []int64{1000, 0}, Lengths: []int64{48, 1024}, Data: make([]byte, 48*1024)}}}
	var err error
	wait.ForNil(t, 10*time.Second, "step 2 consistent", func() error {
		_, err = session(t, cs[2], "fx", 0, 2).RestoreInto(ctxT(t), l)
		if errors.Is(err, sdk.ErrNotFound) {
			return err
		}
		return nil
	})
	if !errors.Is(err, sdk.ErrResourceExhausted) || errors.Is(err, sdk.ErrCorrupt) {
		t.Fatalf("restore through an agent out of budget: %v; want ErrResourceExhausted, not ErrCorrupt", err)
	}
	if !strings.Contains(err.Error(), `tensor "w" of rank 0`) || !strings.Contains(err.Error(), "fetching") {
		t.Fatalf("error %q does not name the tensor, the rank and the fetch that failed", err)
	}
}

// errAny: any error will do.
var errAny = errors.New("any error")
