package demo

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

func TestModelDeterministic(t *testing.T) {
	const size = 1 << 20
	ref, err := Reference(size, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(ref) != 6 {
		t.Fatalf("reference has %d digests, want 6", len(ref))
	}
	s, err := NewState(size)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for step := range int64(6) {
		if step > 0 {
			s.Step()
		}
		if s.Obj.Step != step {
			t.Fatalf("state at step %d after %d steps", s.Obj.Step, step)
		}
		d := s.Digest()
		if d != ref[step] {
			t.Fatalf("step %d: digest %s, reference %s", step, d, ref[step])
		}
		if seen[d] {
			t.Fatalf("step %d: digest %s repeats an earlier step's: the step changes nothing", step, d)
		}
		seen[d] = true
		if math.IsNaN(s.Obj.Loss) || math.IsInf(s.Obj.Loss, 0) || s.Obj.Loss <= 0 {
			t.Fatalf("step %d: loss %v", step, s.Obj.Loss)
		}
	}
}

func TestModelLayout(t *testing.T) {
	s, err := NewState(64 << 20)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	dtypes := map[shm.DType]int{}
	for _, ts := range s.Tensors {
		total += int64(len(ts.Data))
		dtypes[ts.DType]++
	}
	if total > 64<<20 || total < 63<<20 {
		t.Errorf("64 MiB model holds %d bytes", total)
	}
	if dtypes[shm.F32] != 3 || dtypes[shm.BF16] != 1 || dtypes[shm.I64] != 1 {
		t.Errorf("dtypes %v, want 3 F32, 1 BF16, 1 I64", dtypes)
	}
	if _, err := NewState(MinSize - 1); err == nil {
		t.Error("a state below MinSize was accepted")
	}
}

// TestFromCheckpoint checks that a state taken apart as Save sees it and
// rebuilt as Restore returns it continues bit for bit, and that a
// checkpoint of another layout is refused.
func TestFromCheckpoint(t *testing.T) {
	const size = 256 << 10
	s, _ := NewState(size)
	s.Step()
	s.Step()
	obj, _ := json.Marshal(s.Obj)
	ck := &sdk.Checkpoint{Job: "demo", Step: 2, Objects: obj}
	for _, ts := range s.Tensors {
		ts.Data = bytes.Clone(ts.Data)
		ck.Tensors = append(ck.Tensors, ts)
	}
	r, err := FromCheckpoint(ck, size)
	if err != nil {
		t.Fatal(err)
	}
	if r.Digest() != s.Digest() {
		t.Fatal("restored state's digest differs")
	}
	s.Step()
	r.Step()
	if r.Digest() != s.Digest() {
		t.Fatal("restored state diverges after a step")
	}
	if _, err := FromCheckpoint(ck, 2*size); err == nil {
		t.Error("checkpoint of another size accepted")
	}
	ck.Step = 3
	if _, err := FromCheckpoint(ck, size); err == nil {
		t.Error("checkpoint whose objects name another step accepted")
	}
}

func TestBF16RoundTrip(t *testing.T) {
	b := make([]byte, 2)
	for _, v := range []float32{0, 1, -1, 0.5, 3.140625, -1e-3} {
		putBF16(b, 0, v)
		got := bf16(b, 0)
		if d := math.Abs(float64(got - v)); d > math.Abs(float64(v))/128 {
			t.Errorf("bf16(%v) = %v", v, got)
		}
	}
}

func BenchmarkStep64MiB(b *testing.B) {
	s, _ := NewState(64 << 20)
	b.SetBytes(64 << 20)
	for b.Loop() {
		s.Step()
	}
}

func BenchmarkDigest64MiB(b *testing.B) {
	s, _ := NewState(64 << 20)
	b.SetBytes(64 << 20)
	for b.Loop() {
		s.Digest()
	}
}
