// Command gowriter writes rewind shards with the Go implementation, so the
// Python SDK's tests can check that both sides agree byte for byte.
//
//	gowriter file OUT          write a shard with shm.NewLayout into OUT
//	gowriter save SOCKET JOB   save step 5 of JOB rank 0 with the Go SDK
//
// The tensors and objects are the fixed set below; the Python tests build
// the same set (tests/test_golden.py). It lives under testdata so that
// `go build ./...` and `go vet ./...` leave it alone.
package main

import (
	"context"
	"fmt"
	"os"

	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

type spec struct {
	name  string
	dtype shm.DType
	shape []int64
}

// chunks place some tensors as pieces of larger ones (rewind.chunks),
// names with escapes among them.
var chunks = map[string]*shm.Chunk{
	"a/weight":    {GlobalShape: []int64{6, 5}, Offsets: []int64{3, 0}},
	"b<&>\"q\"\\": {GlobalShape: []int64{20}, Offsets: []int64{13}},
	"scalar":      {GlobalShape: []int64{}, Offsets: []int64{}},
}

// specs exercise the header encoder: odd names (JSON escapes, HTML
// characters, non-ASCII, U+2028), every element size, an empty tensor,
// a scalar, and a tensor of several 1 MiB checksum leaves.
var specs = []spec{
	{"a/weight", shm.F32, []int64{3, 5}},
	{"b<&>\"q\"\\", shm.U8, []int64{7}},
	{"ctrl\n\t\x01\x7f", shm.I16, []int64{2, 2}},
	{"ünï\u2028\u2029", shm.BF16, []int64{9}},
	{"empty", shm.F64, []int64{0, 4}},
	{"scalar", shm.I64, []int64{}},
	{"big", shm.F32, []int64{655360}}, // 2.5 MiB: three leaves
	{"flag", shm.Bool, []int64{5}},
	{"half", shm.F16, []int64{3}},
	{"i8", shm.I8, []int64{4}},
	{"i32", shm.I32, []int64{6}},
	{"u32", shm.U32, []int64{2}},
}

// objects is passed verbatim; it has escapes of its own.
const objects = `{"format":"go-test","s":"<a&b>\n\u2028 ü","n":[1,2.5,null,true]}`

// fill returns deterministic bytes for tensor k.
func fill(k int, n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((i*31 + k*7 + i>>9) & 0xff)
	}
	return b
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gowriter:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	switch {
	case len(args) == 2 && args[0] == "file":
		return writeFile(args[1])
	case len(args) == 3 && args[0] == "save":
		return save(args[1], args[2])
	}
	return fmt.Errorf("usage: gowriter file OUT | gowriter save SOCKET JOB")
}

func writeFile(out string) error {
	ts := make([]shm.TensorSpec, len(specs))
	data := map[string][]byte{}
	for k, s := range specs {
		ts[k] = shm.TensorSpec{Name: s.name, DType: s.dtype, Shape: s.shape, Chunk: chunks[s.name]}
		n, _ := s.dtype.NumBytes(s.shape)
		data[s.name] = fill(k, n)
	}
	l, err := shm.NewLayout(shm.ShardMeta{Job: "golden", Rank: 1, WorldSize: 4, Step: 42}, ts, []byte(objects))
	if err != nil {
		return err
	}
	file := make([]byte, l.Size)
	copies := make([]shm.Copy, len(l.Tensors))
	for i, t := range l.Tensors {
		copies[i] = shm.Copy{Dst: file[l.DataStart+t.Begin : l.DataStart+t.End], Src: data[t.Name]}
	}
	for i, sum := range shm.CopyAndSum(copies, 1) {
		l.SetSum(i, sum)
	}
	copy(file, l.Header())
	fmt.Println(shm.HeaderSum(l.Header()))
	return os.WriteFile(out, file, 0o644)
}

func save(socket, job string) error {
	ctx := context.Background()
	c, err := sdk.Dial(ctx, socket)
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.Session(job, 0, 1)
	if err != nil {
		return err
	}
	defer s.Close()
	var ts []sdk.Tensor
	for k, sp := range specs {
		n, _ := sp.dtype.NumBytes(sp.shape)
		ts = append(ts, sdk.Tensor{Name: sp.name, DType: sp.dtype, Shape: sp.shape, Data: fill(k, n)})
	}
	return s.Save(ctx, 5, ts, map[string]any{"from": "go", "step": 5})
}
