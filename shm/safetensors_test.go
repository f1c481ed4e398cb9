package shm_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"

	"rewind.dev/rewind/shm"
)

// stTensor and stFile are a safetensors file as the specification
// (huggingface/safetensors, "Format") describes it, parsed here with nothing
// but encoding/json so that Header() is checked against the specification
// rather than against shm's own decoder.
type stTensor struct {
	name        string
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

type stFile struct {
	headerLen int64
	metadata  map[string]string
	tensors   []stTensor // sorted by offset
}

// parseSafetensors checks every rule of the specification and the rules
// DESIGN.md adds (4 KiB alignment, spaces as padding, no holes), and returns
// the first violation.
func parseSafetensors(file []byte) (*stFile, error) {
	if len(file) < 8 {
		return nil, fmt.Errorf("file of %d bytes has no header length", len(file))
	}
	n := binary.LittleEndian.Uint64(file)
	if n > 100_000_000 || n > uint64(len(file)-8) {
		return nil, fmt.Errorf("header length %d, file %d bytes", n, len(file))
	}
	if (8+n)%4096 != 0 {
		return nil, fmt.Errorf("data starts at %d, not a multiple of 4096", 8+n)
	}
	raw := file[8 : 8+n]
	if len(raw) == 0 || raw[0] != '{' {
		return nil, fmt.Errorf("header does not start with '{'")
	}
	body := bytes.TrimRight(raw, " ")
	if body[len(body)-1] != '}' || !json.Valid(body) {
		return nil, fmt.Errorf("header is not one JSON object followed by spaces only")
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, err
	}
	f := &stFile{headerLen: int64(n)}
	for k, v := range top {
		if k == "__metadata__" {
			var md map[string]json.RawMessage
			if err := json.Unmarshal(v, &md); err != nil {
				return nil, fmt.Errorf("__metadata__: %v", err)
			}
			f.metadata = map[string]string{}
			for mk, mv := range md {
				var s string
				if len(mv) == 0 || mv[0] != '"' || json.Unmarshal(mv, &s) != nil {
					return nil, fmt.Errorf("__metadata__[%q] = %s is not a string", mk, mv)
				}
				f.metadata[mk] = s
			}
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(v))
		dec.DisallowUnknownFields()
		t := stTensor{name: k}
		if err := dec.Decode(&t); err != nil {
			return nil, fmt.Errorf("tensor %q: %v", k, err)
		}
		size, ok := specElemSize[t.DType]
		if !ok || t.Shape == nil {
			return nil, fmt.Errorf("tensor %q: dtype %q shape %v", k, t.DType, t.Shape)
		}
		for _, d := range t.Shape {
			size *= d
		}
		if t.DataOffsets[1]-t.DataOffsets[0] != size {
			return nil, fmt.Errorf("tensor %q: offsets %v for %d bytes", k, t.DataOffsets, size)
		}
		if t.DataOffsets[0]%specElemSize[t.DType] != 0 {
			return nil, fmt.Errorf("tensor %q of %s starts at %d, not aligned to its element", k, t.DType, t.DataOffsets[0])
		}
		f.tensors = append(f.tensors, t)
	}
	slices.SortFunc(f.tensors, func(a, b stTensor) int {
		if a.DataOffsets[0] != b.DataOffsets[0] {
			return int(a.DataOffsets[0] - b.DataOffsets[0])
		}
		return int(a.DataOffsets[1] - b.DataOffsets[1])
	})
	var off int64
	for _, t := range f.tensors {
		if t.DataOffsets[0] != off {
			return nil, fmt.Errorf("tensor %q starts at %d, previous ends at %d", t.name, t.DataOffsets[0], off)
		}
		off = t.DataOffsets[1]
	}
	if off != int64(len(file))-8-int64(n) {
		return nil, fmt.Errorf("tensors cover %d bytes, data section is %d", off, int64(len(file))-8-int64(n))
	}
	return f, nil
}

// Every shard of the round-trip table is a safetensors file by the letter of
// the specification, its header describes what the layout planned, and its
// checksums are ChecksumAlgo's (refSum, in checksum_test.go).
func TestHeaderIsSafetensors(t *testing.T) {
	for name, tc := range roundTripCases() {
		t.Run(name, func(t *testing.T) {
			s := buildShard(t, tc.meta, tc.specs, tc.objects)
			f, err := parseSafetensors(s.file)
			if err != nil {
				t.Fatalf("not a valid safetensors file: %v\nheader: %s", err, headerText(s.file))
			}
			if got := 8 + f.headerLen; got != s.layout.DataStart || got%shm.Alignment != 0 {
				t.Errorf("data starts at %d, layout says %d", got, s.layout.DataStart)
			}
			if len(f.tensors) != len(tc.specs) {
				t.Fatalf("%d tensors in the header, %d written", len(f.tensors), len(tc.specs))
			}
			for i, st := range f.tensors {
				lt := s.layout.Tensors[i] // both in data order
				if st.name != lt.Name && lt.Len() != 0 {
					t.Errorf("tensor %d in data order: header %q, layout %q", i, st.name, lt.Name)
				}
				lt2 := findTensor(s.layout.Tensors, st.name)
				if lt2 == nil || st.DType != string(lt2.DType) || !slices.Equal(st.Shape, lt2.Shape) ||
					st.DataOffsets != [2]int64{lt2.Begin, lt2.End} {
					t.Errorf("header has %q %s%v at %v, layout %+v", st.name, st.DType, st.Shape, st.DataOffsets, lt2)
				}
			}
			md := f.metadata
			want := map[string]string{
				"rewind.format":     "1",
				"rewind.job":        tc.meta.Job,
				"rewind.rank":       strconv.FormatUint(uint64(tc.meta.Rank), 10),
				"rewind.world_size": strconv.FormatUint(uint64(tc.meta.WorldSize), 10),
				"rewind.step":       strconv.FormatInt(tc.meta.Step, 10),
				"rewind.checksum":   "xxh3-64-tree-1MiB",
			}
			for k, v := range want {
				if md[k] != v {
					t.Errorf("__metadata__[%q] = %q, want %q", k, md[k], v)
				}
			}
			if o, ok := md["rewind.objects"]; ok != (tc.objects != nil) || o != string(tc.objects) {
				t.Errorf("__metadata__[rewind.objects] = %q (present %v), want %q", o, ok, tc.objects)
			}
			for name, data := range s.data {
				if got, want := md["rewind.sum."+name], fmt.Sprintf("%016x", refSum(data)); got != want {
					t.Errorf("checksum of %q in the header is %q, want %q", name, got, want)
				}
			}
		})
	}
}

func headerText(file []byte) string {
	if len(file) < 8 {
		return ""
	}
	n := min(binary.LittleEndian.Uint64(file), uint64(len(file)-8), 2000)
	return string(bytes.TrimRight(file[8:8+n], " "))
}

// A file written by another safetensors writer (header padded to 8 bytes,
// only a "format" key in __metadata__, dtypes in any order) decodes as a
// plain file: Rewind false, no meta, tensors and metadata as written.
func TestDecodePlainSafetensors(t *testing.T) {
	data := make([]byte, 2*3*4+4*2+1)
	fill(data, 7)
	file := jsonFile(t, map[string]any{
		"__metadata__": map[string]string{"format": "pt"},
		"bias":         tensorJSON("BF16", []int64{4}, 24, 32),
		"weight":       tensorJSON("F32", []int64{2, 3}, 0, 24),
		"mask":         tensorJSON("BOOL", []int64{1}, 32, 33),
	}, data)
	if (len(file)-len(data))%shm.Alignment == 0 {
		t.Fatal("test file happens to be 4 KiB-aligned; it should not be")
	}
	h, err := shm.DecodeBytes(file)
	if err != nil {
		t.Fatalf("DecodeBytes: %v", err)
	}
	if h.Rewind || h.Meta != (shm.ShardMeta{}) || h.Objects != nil {
		t.Errorf("plain file decoded with Rewind=%v meta %+v objects %q", h.Rewind, h.Meta, h.Objects)
	}
	if h.Metadata["format"] != "pt" || len(h.Metadata) != 1 {
		t.Errorf("metadata %v, want map[format:pt]", h.Metadata)
	}
	var got []string
	for _, tt := range h.Tensors {
		got = append(got, fmt.Sprintf("%s %s%v [%d,%d)", tt.Name, tt.DType, tt.Shape, tt.Begin, tt.End))
	}
	want := []string{"weight F32[2 3] [0,24)", "bias BF16[4] [24,32)", "mask BOOL[1] [32,33)"}
	if !slices.Equal(got, want) {
		t.Errorf("tensors %q, want %q", got, want)
	}
	if h.DataStart != int64(len(file)-len(data)) || h.Size != int64(len(file)) {
		t.Errorf("DataStart %d Size %d, want %d %d", h.DataStart, h.Size, len(file)-len(data), len(file))
	}

	// No __metadata__ at all, and no tensors: both are valid files.
	for _, hdr := range []string{`{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, `{}`} {
		d := []byte{1, 2}
		if hdr == `{}` {
			d = nil
		}
		if h, err := shm.DecodeBytes(rawFile(hdr, d)); err != nil || h.Rewind {
			t.Errorf("DecodeBytes(%s): %v", hdr, err)
		}
	}
}
