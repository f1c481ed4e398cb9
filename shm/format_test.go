package shm_test

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"rewind.dev/rewind/shm"
)

type roundTripCase struct {
	meta    shm.ShardMeta
	specs   []shm.TensorSpec
	objects []byte // nil: no non-tensor state
}

func roundTripCases() map[string]roundTripCase {
	var every []shm.TensorSpec
	for i, d := range allDTypes {
		// Smallest element size first, so the layout has to reorder them.
		every = append(every, shm.TensorSpec{Name: "t." + string(d), DType: d, Shape: []int64{int64(i%3 + 1), 5}})
	}
	var many []shm.TensorSpec
	for i := range 300 {
		many = append(many, shm.TensorSpec{
			Name:  fmt.Sprintf("layers.%d.weight", i),
			DType: allDTypes[(i*7)%len(allDTypes)],
			Shape: []int64{int64(i%5 + 1), int64(i%3 + 1)},
		})
	}
	return map[string]roundTripCase{
		"no tensors, no objects": {meta: testMeta},
		"every dtype": {
			meta:    testMeta,
			specs:   every,
			objects: []byte(`{"optimizer":{"lr":0.001,"betas":[0.9,0.999]},"rng":[1,2,3]}`),
		},
		"scalars": {
			meta: testMeta,
			specs: []shm.TensorSpec{
				{Name: "step", DType: shm.I64, Shape: nil},
				{Name: "loss", DType: shm.F32, Shape: []int64{}},
				{Name: "flag", DType: shm.Bool},
				{Name: "scale", DType: shm.BF16, Shape: []int64{}},
			},
		},
		"zero-size tensors": {
			meta: testMeta,
			specs: []shm.TensorSpec{
				{Name: "empty", DType: shm.F32, Shape: []int64{0}},
				{Name: "w", DType: shm.F32, Shape: []int64{4, 4}},
				{Name: "rows", DType: shm.F32, Shape: []int64{3, 0}},
				{Name: "bytes", DType: shm.U8, Shape: []int64{0, 7}},
				{Name: "tail", DType: shm.U8, Shape: []int64{3}},
			},
		},
		"many small tensors": {meta: testMeta, specs: many, objects: []byte(`[]`)},
		"tensor larger than a leaf, not a multiple of it": {
			meta: testMeta,
			specs: []shm.TensorSpec{
				{Name: "big", DType: shm.U8, Shape: []int64{3*shm.LeafSize + 17}},
				{Name: "f", DType: shm.F32, Shape: []int64{shm.LeafSize/4 + 1}},
				{Name: "small", DType: shm.I16, Shape: []int64{3}},
			},
		},
		"names needing JSON escaping": {
			meta: testMeta,
			specs: []shm.TensorSpec{
				{Name: `quo"te`, DType: shm.F32, Shape: []int64{1}},
				{Name: `back\slash`, DType: shm.F32, Shape: []int64{1}},
				{Name: "ünïcödé.层.🙂", DType: shm.F16, Shape: []int64{2}},
				{Name: "<script>&amp;</script>", DType: shm.U8, Shape: []int64{3}},
				{Name: "tab\tnewline\nnul\x00", DType: shm.U8, Shape: []int64{1}},
				{Name: "line\u2028sep", DType: shm.U8, Shape: []int64{1}},
				{Name: "rewind.sum.x", DType: shm.U8, Shape: []int64{1}},
				{Name: "x", DType: shm.U8, Shape: []int64{1}},
				{Name: "__metadata__.not", DType: shm.U8, Shape: []int64{1}},
			},
			objects: []byte(`{"name":"<\"q\">\u00e9\\","n":null}`),
		},
		"objects only": {meta: testMeta, objects: []byte(` {"a": [1, 2.5e-3, "x"], "b": {}} `)},
		"objects null": {meta: testMeta, objects: []byte(`null`), specs: []shm.TensorSpec{{Name: "a", DType: shm.U8, Shape: []int64{1}}}},
		"sharded tensors": {
			meta: shm.ShardMeta{Job: "llama.70b_run3", Rank: 3, WorldSize: 8, Step: 7},
			specs: []shm.TensorSpec{
				{Name: "emb", DType: shm.BF16, Shape: []int64{16, 8}, Chunk: &shm.Chunk{GlobalShape: []int64{128, 8}, Offsets: []int64{48, 0}}},
				{Name: "norm", DType: shm.F32, Shape: []int64{8}},
				{Name: "head", DType: shm.BF16, Shape: []int64{8, 4}, Chunk: &shm.Chunk{GlobalShape: []int64{8, 32}, Offsets: []int64{0, 12}}},
			},
		},
		"extreme meta": {
			meta:  shm.ShardMeta{Job: strings.Repeat("j", shm.MaxJobLen), Rank: math.MaxUint32 - 1, WorldSize: math.MaxUint32, Step: math.MaxInt64},
			specs: []shm.TensorSpec{{Name: "a", DType: shm.U64, Shape: []int64{2}}},
		},
	}
}

func TestRoundTrip(t *testing.T) {
	for name, tc := range roundTripCases() {
		t.Run(name, func(t *testing.T) { runRoundTrip(t, tc) })
	}
}

func runRoundTrip(t *testing.T, tc roundTripCase) {
	s := buildShard(t, tc.meta, tc.specs, tc.objects)
	l := s.layout
	h, err := shm.DecodeBytes(s.file)
	if err != nil {
		t.Fatalf("DecodeBytes: %v", err)
	}
	if !h.Rewind || h.Meta != tc.meta {
		t.Errorf("decoded Rewind=%v meta %+v, want true and %+v", h.Rewind, h.Meta, tc.meta)
	}
	if !bytes.Equal(h.Objects, tc.objects) || (h.Objects == nil) != (tc.objects == nil) {
		t.Errorf("objects = %q, want %q", h.Objects, tc.objects)
	}
	if h.DataStart != l.DataStart || h.Size != l.Size || h.Size != int64(len(s.file)) || h.HeaderLen != h.DataStart-8 {
		t.Errorf("decoded DataStart/Size/HeaderLen %d/%d/%d, layout %d/%d", h.DataStart, h.Size, h.HeaderLen, l.DataStart, l.Size)
	}
	if len(h.Tensors) != len(tc.specs) || len(l.Tensors) != len(tc.specs) {
		t.Fatalf("decoded %d tensors, layout %d, specs %d", len(h.Tensors), len(l.Tensors), len(tc.specs))
	}
	for _, spec := range tc.specs {
		got, lt := h.Tensor(spec.Name), findTensor(l.Tensors, spec.Name)
		if got == nil || lt == nil {
			t.Errorf("tensor %q: decoded %v, in layout %v", spec.Name, got != nil, lt != nil)
			continue
		}
		if got.DType != spec.DType || !slices.Equal(got.Shape, spec.Shape) || !reflect.DeepEqual(got.Chunk, spec.Chunk) {
			t.Errorf("tensor %q decoded as %s%v chunk %+v, want %s%v chunk %+v",
				spec.Name, got.DType, got.Shape, got.Chunk, spec.DType, spec.Shape, spec.Chunk)
		}
		want := specElemSize[string(spec.DType)]
		for _, d := range spec.Shape {
			want *= d
		}
		if got.Begin != lt.Begin || got.End != lt.End || got.Len() != want {
			t.Errorf("tensor %q at [%d,%d), layout [%d,%d), want %d bytes", spec.Name, got.Begin, got.End, lt.Begin, lt.End, want)
		}
		if !got.HasSum || got.Sum != shm.Sum(s.data[spec.Name]) {
			t.Errorf("tensor %q: decoded sum %x (HasSum %v), want %x", spec.Name, got.Sum, got.HasSum, shm.Sum(s.data[spec.Name]))
		}
	}
	if !slices.IsSortedFunc(h.Tensors, func(a, b shm.Tensor) int { return int(a.Begin - b.Begin) }) {
		t.Errorf("decoded tensors not sorted by offset")
	}
	for _, w := range []int{1, 3} {
		if err := h.Verify(s.file, w); err != nil {
			t.Errorf("Verify(workers=%d): %v", w, err)
		}
		dst := make([][]byte, len(h.Tensors))
		for i, tt := range h.Tensors {
			dst[i] = bytes.Repeat([]byte{0xAA}, int(tt.Len()))
		}
		if err := h.CopyOut(s.file, dst, w); err != nil {
			t.Errorf("CopyOut(workers=%d): %v", w, err)
		}
		for i, tt := range h.Tensors {
			if !bytes.Equal(dst[i], s.data[tt.Name]) {
				t.Errorf("CopyOut(workers=%d): tensor %q differs from what was written", w, tt.Name)
			}
		}
	}
}

func findTensor(ts []shm.Tensor, name string) *shm.Tensor {
	for i := range ts {
		if ts[i].Name == name {
			return &ts[i]
		}
	}
	return nil
}

func TestNewLayoutRejects(t *testing.T) {
	f32 := []shm.TensorSpec{{Name: "a", DType: shm.F32, Shape: []int64{1}}}
	cases := map[string]struct {
		meta    shm.ShardMeta
		specs   []shm.TensorSpec
		objects []byte
	}{
		"bad job":            {meta: shm.ShardMeta{Job: "../x", WorldSize: 1}, specs: f32},
		"empty job":          {meta: shm.ShardMeta{WorldSize: 1}, specs: f32},
		"world size 0":       {meta: shm.ShardMeta{Job: "j"}, specs: f32},
		"rank = world size":  {meta: shm.ShardMeta{Job: "j", Rank: 4, WorldSize: 4}, specs: f32},
		"negative step":      {meta: shm.ShardMeta{Job: "j", WorldSize: 1, Step: -1}, specs: f32},
		"objects not JSON":   {meta: testMeta, objects: []byte(`{"a":`)},
		"objects empty":      {meta: testMeta, objects: []byte{}},
		"empty name":         {meta: testMeta, specs: []shm.TensorSpec{{Name: "", DType: shm.F32}}},
		"name __metadata__":  {meta: testMeta, specs: []shm.TensorSpec{{Name: "__metadata__", DType: shm.F32}}},
		"duplicate name":     {meta: testMeta, specs: []shm.TensorSpec{{Name: "a", DType: shm.F32}, {Name: "a", DType: shm.U8}}},
		"unknown dtype":      {meta: testMeta, specs: []shm.TensorSpec{{Name: "a", DType: "F128"}}},
		"lower-case dtype":   {meta: testMeta, specs: []shm.TensorSpec{{Name: "a", DType: "f32"}}},
		"negative dimension": {meta: testMeta, specs: []shm.TensorSpec{{Name: "a", DType: shm.F32, Shape: []int64{2, -1}}}},
		"overflowing shape":  {meta: testMeta, specs: []shm.TensorSpec{{Name: "a", DType: shm.F64, Shape: []int64{1 << 31, 1 << 31, 4}}}},
		"huge dimensions":    {meta: testMeta, specs: []shm.TensorSpec{{Name: "a", DType: shm.F64, Shape: []int64{math.MaxInt64, math.MaxInt64}}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if l, err := shm.NewLayout(tc.meta, tc.specs, tc.objects); err == nil {
				t.Fatalf("NewLayout accepted it: %d tensors, %d bytes", len(l.Tensors), l.Size)
			} else if !strings.HasPrefix(err.Error(), "shm: ") {
				t.Errorf("error %q does not name its component", err)
			}
		})
	}
}

// A name or an objects document that is not valid UTF-8 cannot be written
// into a JSON header unchanged: encoding/json replaces the bad bytes with
// U+FFFD. NewLayout must refuse it rather than write a shard that decodes to
// other names, or, as here where two names collapse into one JSON key, a
// shard its own decoder rejects as corrupt.
func TestNewLayoutInvalidUTF8(t *testing.T) {
	cases := map[string]struct {
		specs   []shm.TensorSpec
		objects []byte
	}{
		"one name": {specs: []shm.TensorSpec{{Name: "w\xff", DType: shm.U8, Shape: []int64{2}}}},
		"two names that collide": {specs: []shm.TensorSpec{
			{Name: "w\xff", DType: shm.U8, Shape: []int64{2}},
			{Name: "w\xfe", DType: shm.U8, Shape: []int64{3}},
		}},
		"objects": {objects: []byte("{\"rng\":\"\xff\xfe\"}")},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := shm.NewLayout(testMeta, tc.specs, tc.objects); err != nil {
				return // refused: fine
			}
			s := buildShard(t, testMeta, tc.specs, tc.objects)
			h, err := shm.DecodeBytes(s.file)
			if err != nil {
				t.Fatalf("NewLayout accepted it, but the shard it wrote does not decode: %v", err)
			}
			for _, spec := range tc.specs {
				if h.Tensor(spec.Name) == nil {
					t.Errorf("NewLayout accepted name %q, but the shard does not hold it", spec.Name)
				}
			}
			if !bytes.Equal(h.Objects, tc.objects) {
				t.Errorf("NewLayout accepted objects %q, but the shard holds %q", tc.objects, h.Objects)
			}
		})
	}
}

// NewLayout must not plan a header that Decode (and the safetensors
// reference implementation, which has the same 100 MB limit) will refuse.
func TestNewLayoutHeaderLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates several hundred MB")
	}
	objects := make([]byte, shm.MaxHeaderBytes+2)
	for i := range objects {
		objects[i] = 'a'
	}
	objects[0], objects[len(objects)-1] = '"', '"'
	l, err := shm.NewLayout(testMeta, nil, objects)
	if err == nil {
		_, derr := shm.DecodeBytes(l.Header())
		t.Fatalf("NewLayout planned a %d-byte header, over MaxHeaderBytes (%d); Decode says: %v", len(l.Header())-8, shm.MaxHeaderBytes, derr)
	}
}

// A chunk records where a tensor sits in its global tensor, so it must have
// one global dimension and one offset per dimension of the tensor, and the
// tensor must fit: a restore that reshards indexes with these.
func TestNewLayoutRejectsInconsistentChunk(t *testing.T) {
	cases := map[string]shm.Chunk{
		"offsets shorter than shape":      {GlobalShape: []int64{8, 8}, Offsets: []int64{0}},
		"global shape shorter than shape": {GlobalShape: []int64{8}, Offsets: []int64{0, 0}},
		"piece outside the global tensor": {GlobalShape: []int64{8, 8}, Offsets: []int64{6, 0}},
		"negative offset":                 {GlobalShape: []int64{8, 8}, Offsets: []int64{-1, 0}},
	}
	for name, ch := range cases {
		t.Run(name, func(t *testing.T) {
			specs := []shm.TensorSpec{{Name: "w", DType: shm.F32, Shape: []int64{4, 8}, Chunk: &ch}}
			if _, err := shm.NewLayout(testMeta, specs, nil); err == nil {
				t.Errorf("NewLayout accepted a %v piece with chunk %+v", specs[0].Shape, ch)
			}
		})
	}
}

func TestLayoutSetSumOnlyTouchesItsDigits(t *testing.T) {
	specs := []shm.TensorSpec{{Name: "a", DType: shm.U8, Shape: []int64{1}}, {Name: "b", DType: shm.F64, Shape: []int64{1}}}
	l, err := shm.NewLayout(testMeta, specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := bytes.Clone(l.Header())
	l.SetSum(0, 0x0123456789abcdef)
	after := l.Header()
	diff := 0
	for i := range before {
		if before[i] != after[i] {
			diff++
		}
	}
	if diff == 0 || diff > 16 || !bytes.Contains(after, []byte(`"rewind.sum.`+l.Tensors[0].Name+`":"0123456789abcdef"`)) {
		t.Errorf("SetSum changed %d header bytes; header: %s", diff, bytes.TrimRight(after[8:], " "))
	}
}

// HeaderSum is what the SDK reports at commit (over Layout.Header()) and
// what the agent recomputes over the segment's first DataStart bytes: both
// must agree, and any change to the data must change it (through the
// tensor checksums the header carries).
func TestHeaderSum(t *testing.T) {
	specs := []shm.TensorSpec{
		{Name: "w", DType: shm.F32, Shape: []int64{64}, Chunk: &shm.Chunk{GlobalShape: []int64{128}, Offsets: []int64{64}}},
		{Name: "v", DType: shm.F32, Shape: []int64{64}, Chunk: &shm.Chunk{GlobalShape: []int64{128}, Offsets: []int64{0}}},
	}
	a, b := buildShard(t, testMeta, specs, []byte(`{}`)), buildShard(t, testMeta, specs, []byte(`{}`))
	h, err := shm.DecodeBytes(a.file)
	if err != nil {
		t.Fatal(err)
	}
	sa := shm.HeaderSum(a.layout.Header())
	if sa != shm.HeaderSum(a.file[:h.DataStart]) || sa != shm.HeaderSum(b.file[:b.layout.DataStart]) {
		t.Errorf("HeaderSum differs between the layout, the decoded segment and a second identical shard")
	}
	if want := fmt.Sprintf("%016x", refSum(a.file[:h.DataStart])); sa != want {
		t.Errorf("HeaderSum = %q, want %q", sa, want)
	}
	l, err := shm.NewLayout(testMeta, specs, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	for i, tt := range l.Tensors {
		data := bytes.Clone(a.data[tt.Name])
		data[3] ^= 0x10
		l.SetSum(i, shm.Sum(data))
		if shm.HeaderSum(l.Header()) == sa {
			t.Errorf("changing tensor %q leaves HeaderSum unchanged", tt.Name)
		}
		l.SetSum(i, shm.Sum(a.data[tt.Name]))
	}
	if shm.HeaderSum(l.Header()) != sa {
		t.Errorf("same content, different HeaderSum")
	}
}
