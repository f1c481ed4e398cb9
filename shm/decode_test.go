package shm_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"rewind.dev/rewind/shm"
)

// baseData is the data section of rewindFile: "w" F32[2,2] at [0,16) and
// "b" U8[3] at [16,19).
func baseData() []byte {
	d := make([]byte, 19)
	fill(d, 3)
	return d
}

// rewindFile builds a small rewind shard by hand, with the metadata keys
// spelled out, and lets edit change the header before it is encoded.
func rewindFile(t *testing.T, edit func(md map[string]string, top map[string]any)) []byte {
	t.Helper()
	data := baseData()
	md := map[string]string{
		"rewind.format":     "1",
		"rewind.job":        "job-1",
		"rewind.rank":       "1",
		"rewind.world_size": "4",
		"rewind.step":       "100",
		"rewind.checksum":   "xxh3-64-tree-1MiB",
		"rewind.sum.w":      fmt.Sprintf("%016x", refSum(data[:16])),
		"rewind.sum.b":      fmt.Sprintf("%016x", refSum(data[16:])),
	}
	top := map[string]any{
		"w": tensorJSON("F32", []int64{2, 2}, 0, 16),
		"b": tensorJSON("U8", []int64{3}, 16, 19),
	}
	if edit != nil {
		edit(md, top)
	}
	top["__metadata__"] = md
	return jsonFile(t, top, data)
}

func TestRewindFileIsValid(t *testing.T) {
	file := rewindFile(t, nil)
	h, err := shm.DecodeBytes(file)
	if err != nil {
		t.Fatalf("the base of the corruption tests does not decode: %v", err)
	}
	if !h.Rewind || h.Meta != testMeta || len(h.Tensors) != 2 {
		t.Fatalf("decoded %+v", h)
	}
	if err := h.Verify(file, 1); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

type corruptCase struct {
	file []byte
}

func corruptCases(t *testing.T) map[string]corruptCase {
	base := rewindFile(t, nil)
	n := binary.LittleEndian.Uint64(base)
	withLen := func(l uint64) []byte {
		b := bytes.Clone(base)
		binary.LittleEndian.PutUint64(b, l)
		return b
	}
	md := func(k, v string) []byte {
		return rewindFile(t, func(md map[string]string, _ map[string]any) {
			if v == "<delete>" {
				delete(md, k)
			} else {
				md[k] = v
			}
		})
	}
	tensor := func(name string, v any) []byte {
		return rewindFile(t, func(_ map[string]string, top map[string]any) { top[name] = v })
	}
	plain := func(hdr string, dataLen int) []byte { return rawFile(hdr, make([]byte, dataLen)) }
	u8 := func(b, e int64) string {
		return fmt.Sprintf(`{"dtype":"U8","shape":[%d],"data_offsets":[%d,%d]}`, e-b, b, e)
	}
	nulPadded := binary.LittleEndian.AppendUint64(nil, 8)
	nulPadded = append(nulPadded, "{}\x00\x00\x00\x00\x00\x00"...)

	return map[string]corruptCase{
		// Framing.
		"empty file":                   {[]byte{}},
		"7 bytes":                      {[]byte{1, 0, 0, 0, 0, 0, 0}},
		"header length 0":              {withLen(0)[:8]},
		"header length 1":              {append(binary.LittleEndian.AppendUint64(nil, 1), '{')},
		"header length past the end":   {withLen(uint64(len(base)-8) + 1)},
		"header length 2^63":           {withLen(1 << 63)},
		"header length over the limit": {withLen(shm.MaxHeaderBytes + 1)},
		"truncated in the header":      {base[:8+n-1]},
		"truncated after the header":   {base[:8+n]},
		"truncated in the data":        {base[:len(base)-1]},
		"data section longer":          {append(bytes.Clone(base), 0)},
		// Not a JSON object.
		"not JSON":             {plain("not json", 0)},
		"truncated JSON":       {plain(`{"w":`, 0)},
		"array":                {plain(`[]`, 0)},
		"string":               {plain(`"{}"`, 0)},
		"two objects":          {plain(`{} {}`, 0)},
		"NUL padding":          {nulPadded},
		"tensor not an object": {tensor("w", 5)},
		"tensor null":          {tensor("w", nil)},
		"metadata a number":    {plain(`{"__metadata__":{"a":1}}`, 0)},
		"metadata a string":    {plain(`{"__metadata__":"a"}`, 0)},
		"metadata nested":      {plain(`{"__metadata__":{"a":{"b":"c"}}}`, 0)},
		// Tensors that do not fit their offsets or each other.
		"unknown dtype":          {tensor("w", tensorJSON("F128", []int64{2, 2}, 0, 16))},
		"lower-case dtype":       {tensor("w", tensorJSON("f32", []int64{2, 2}, 0, 16))},
		"empty dtype":            {tensor("w", tensorJSON("", []int64{2, 2}, 0, 16))},
		"one data offset":        {tensor("w", map[string]any{"dtype": "F32", "shape": []int64{2, 2}, "data_offsets": []int64{0}})},
		"three data offsets":     {tensor("w", map[string]any{"dtype": "F32", "shape": []int64{2, 2}, "data_offsets": []int64{0, 16, 16}})},
		"float data offsets":     {plain(`{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1.5]}}`, 1)},
		"offsets short of shape": {tensor("w", tensorJSON("F32", []int64{2, 3}, 0, 16))},
		"offsets past shape":     {tensor("w", tensorJSON("F32", []int64{2, 1}, 0, 16))},
		"negative begin":         {plain(`{"x":{"dtype":"U8","shape":[4],"data_offsets":[-4,0]}}`, 0)},
		"end before begin":       {plain(`{"x":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, 4)},
		"negative dimension":     {plain(`{"x":{"dtype":"U8","shape":[-1,-4],"data_offsets":[0,4]}}`, 4)},
		"overflowing shape":      {plain(`{"x":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, 0)},
		"hole between tensors":   {plain(`{"a":`+u8(0, 4)+`,"b":`+u8(6, 8)+`}`, 8)},
		"hole at the start":      {plain(`{"a":`+u8(2, 8)+`}`, 8)},
		"overlap":                {plain(`{"a":`+u8(0, 4)+`,"b":`+u8(3, 8)+`}`, 8)},
		"same range twice":       {plain(`{"a":`+u8(0, 4)+`,"b":`+u8(0, 4)+`}`, 4)},
		"zero-size past the end": {plain(`{"a":`+u8(0, 4)+`,"b":`+u8(5, 5)+`}`, 4)},
		"tensor past the end":    {plain(`{"a":`+u8(0, 8)+`}`, 4)},
		"data with no tensors":   {plain(`{}`, 1)},
		// Rewind metadata.
		"missing checksum":          {md("rewind.sum.w", "<delete>")},
		"empty checksum":            {md("rewind.sum.w", "")},
		"checksum of 15 digits":     {md("rewind.sum.w", "000000000000000")},
		"checksum of 17 digits":     {md("rewind.sum.w", "00000000000000000")},
		"checksum not hex":          {md("rewind.sum.w", "zzzzzzzzzzzzzzzz")},
		"checksum with 0x":          {md("rewind.sum.w", "0x00000000000000")},
		"checksum with sign":        {md("rewind.sum.w", "+000000000000000")},
		"checksum for unknown":      {md("rewind.sum.ghost", "0000000000000000")},
		"rank = world size":         {md("rewind.rank", "4")},
		"rank > world size":         {md("rewind.rank", "9")},
		"world size 0":              {md("rewind.world_size", "0")},
		"negative rank":             {md("rewind.rank", "-1")},
		"rank over 32 bits":         {md("rewind.rank", "4294967296")},
		"rank not a number":         {md("rewind.rank", "one")},
		"missing rank":              {md("rewind.rank", "<delete>")},
		"missing world size":        {md("rewind.world_size", "<delete>")},
		"negative step":             {md("rewind.step", "-1")},
		"step not a number":         {md("rewind.step", "1e3")},
		"missing step":              {md("rewind.step", "<delete>")},
		"unsupported format":        {md("rewind.format", "2")},
		"unknown checksum":          {md("rewind.checksum", "crc32c")},
		"missing checksum algo":     {md("rewind.checksum", "<delete>")},
		"job with a path separator": {md("rewind.job", "../x")},
		"missing job":               {md("rewind.job", "<delete>")},
		"objects not JSON":          {md("rewind.objects", `{"a":`)},
		"objects empty":             {md("rewind.objects", "")},
		"chunks not JSON":           {md("rewind.chunks", `{`)},
		"chunks not a map":          {md("rewind.chunks", `[1]`)},
	}
}

func TestDecodeRejectsCorrupt(t *testing.T) {
	for name, tc := range corruptCases(t) {
		t.Run(name, func(t *testing.T) { runCorrupt(t, tc) })
	}
}

func runCorrupt(t *testing.T, tc corruptCase) {
	t.Helper()
	h, err := shm.DecodeBytes(tc.file)
	if err == nil {
		t.Fatalf("decoded %d tensors, meta %+v; header: %s", len(h.Tensors), h.Meta, headerText(tc.file))
	}
	if !errors.Is(err, shm.ErrCorrupt) {
		t.Fatalf("error %q does not wrap ErrCorrupt", err)
	}
	if h != nil {
		t.Errorf("returned a header with the error")
	}
}

// The safetensors specification: "The header data MUST begin with a {
// character (0x7B)". Go's decoder takes any JSON value and leading blanks;
// a null header then decodes as an empty file.
func TestDecodeHeaderMustBeObject(t *testing.T) {
	for name, hdr := range map[string]string{
		"null":          `null`,
		"leading blank": ` {}`,
	} {
		t.Run(name, func(t *testing.T) { runCorrupt(t, corruptCase{rawFile(hdr, nil)}) })
	}
}

// Decode promises that rewind metadata is "complete and consistent"; it
// rejects a checksum for an unknown tensor, but a chunk for an unknown
// tensor, or one that cannot place its tensor, passes, and a restore that
// reshards would index with it.
func TestDecodeRejectsInconsistentChunks(t *testing.T) {
	for name, chunks := range map[string]string{
		"unknown tensor":           `{"ghost":{"global_shape":[4],"offsets":[0]}}`,
		"rank differs from shape":  `{"w":{"global_shape":[4],"offsets":[0]}}`,
		"offsets shorter":          `{"w":{"global_shape":[4,4],"offsets":[0]}}`,
		"piece outside the global": `{"w":{"global_shape":[4,4],"offsets":[3,0]}}`,
	} {
		t.Run(name, func(t *testing.T) {
			runCorrupt(t, corruptCase{rewindFile(t, func(md map[string]string, _ map[string]any) { md["rewind.chunks"] = chunks })})
		})
	}
	// The consistent one decodes.
	h, err := shm.DecodeBytes(rewindFile(t, func(md map[string]string, _ map[string]any) {
		md["rewind.chunks"] = `{"w":{"global_shape":[4,8],"offsets":[2,6]}}`
	}))
	if err != nil || h.Tensor("w").Chunk == nil || !slices.Equal(h.Tensor("w").Chunk.Offsets, []int64{2, 6}) {
		t.Fatalf("valid chunk: %v", err)
	}
}

// Decoding the same bytes twice must give the same tensor order: CopyOut's
// dst follows it, and so does anything that compares or records headers.
// Zero-size tensors share an offset, and Decode orders them by map
// iteration order.
func TestDecodeTensorOrderIsDeterministic(t *testing.T) {
	var specs []shm.TensorSpec
	for i := range 6 {
		specs = append(specs, shm.TensorSpec{Name: fmt.Sprintf("empty%d", i), DType: shm.F32, Shape: []int64{0}})
	}
	specs = append(specs, shm.TensorSpec{Name: "w", DType: shm.F32, Shape: []int64{2}})
	s := buildShard(t, testMeta, specs, nil)
	var first []string
	for i := range 20 {
		h, err := shm.DecodeBytes(s.file)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tt := range h.Tensors {
			names = append(names, tt.Name)
		}
		if i == 0 {
			first = names
		} else if !slices.Equal(names, first) {
			t.Fatalf("decode %d ordered tensors %q, decode 0 %q", i, names, first)
		}
	}
}

type failingReaderAt struct{ err error }

func (r failingReaderAt) ReadAt([]byte, int64) (int, error) { return 0, r.err }

// An I/O error is not corruption: a caller retries the one and discards the
// other.
func TestDecodeReadErrorIsNotCorrupt(t *testing.T) {
	ioErr := errors.New("disk on fire")
	_, err := shm.Decode(failingReaderAt{ioErr}, 1<<20)
	if !errors.Is(err, ioErr) || errors.Is(err, shm.ErrCorrupt) {
		t.Errorf("Decode with a failing reader: %v; want the reader's error, not ErrCorrupt", err)
	}
	if !strings.HasPrefix(fmt.Sprint(err), "shm: ") {
		t.Errorf("error %q does not name its component", err)
	}
}
