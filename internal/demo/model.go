package demo

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/zeebo/xxh3"

	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// The simulated model: three F32 matrices, the BF16 momentum of the first,
// and an I64 vector of data-loader positions. Every matrix has the same
// number of rows, chosen so that the state is about the size asked for.
const (
	cols      = 256                // row width of every matrix
	cursorLen = 64                 // data-loader positions in the I64 tensor
	initSeed  = 0x5eed_0123_4567_9 // xorshift state of a fresh run
	bytesPerI = 3*4 + 2            // bytes per matrix element: three F32, one BF16
	lr        = float32(0.05)      // learning rate of the simulated update
)

// Index of each tensor in State.Tensors.
const (
	tEmbed = iota
	tMLP
	tHead
	tMomentum
	tCursor
)

// Objects is the non-tensor state saved with every step, as JSON.
type Objects struct {
	Step int64   `json:"step"`
	Loss float64 `json:"loss"`
	RNG  uint64  `json:"rng"` // xorshift64 state after this step
}

// State is the whole training state of the simulated rank. Step advances it
// deterministically: the same starting state always gives the same bytes.
type State struct {
	Tensors []sdk.Tensor
	Obj     Objects
}

// MinSize is the smallest state size the model can be laid out in.
const MinSize = 64 << 10

// layout returns zeroed tensors for a state of about size bytes, in the
// model's order (a checkpoint holds them in its own).
func layout(size int64) ([]sdk.Tensor, error) {
	rows := (size - cursorLen*8) / (bytesPerI * cols)
	if size < MinSize || rows < 1 {
		return nil, fmt.Errorf("demo: state size %d bytes is below the minimum %s", size, units.Bytes(MinSize))
	}
	mk := func(name string, dt shm.DType, shape ...int64) sdk.Tensor {
		n, _ := dt.NumBytes(shape)
		return sdk.Tensor{Name: name, DType: dt, Shape: shape, Data: make([]byte, n)}
	}
	return []sdk.Tensor{
		tEmbed:    mk("embed.weight", shm.F32, rows, cols),
		tMLP:      mk("mlp.weight", shm.F32, rows, cols),
		tHead:     mk("head.weight", shm.F32, rows, cols),
		tMomentum: mk("embed.exp_avg", shm.BF16, rows, cols),
		tCursor:   mk("data.cursor", shm.I64, cursorLen),
	}, nil
}

// NewState returns the deterministic initial state (step 0) of a model of
// about size bytes.
func NewState(size int64) (*State, error) { return NewRankState(size, 0) }

// NewRankState is NewState for one rank of a job: every rank starts from
// its own weights (its shard of the model), rank 0 from NewState's.
func NewRankState(size int64, rank uint32) (*State, error) {
	ts, err := layout(size)
	if err != nil {
		return nil, err
	}
	s := &State{Tensors: ts, Obj: Objects{RNG: initSeed ^ uint64(rank)*0x9e3779b97f4a7c15}}
	r := xorshift(&s.Obj.RNG)
	w0, w1, w2 := ts[tEmbed].Data, ts[tMLP].Data, ts[tHead].Data
	for i := range len(w0) / 4 {
		x := mix(r, i)
		putF32(w0, i, float32(0.02*noise(uint32(x>>32))))
		putF32(w1, i, float32(0.02*noise(uint32(x))))
		putF32(w2, i, float32(0.02*noise(uint32(x>>16))))
	}
	s.Obj.Loss = s.loss()
	return s, nil
}

// FromCheckpoint rebuilds the state from a restored checkpoint, checking
// that it has the layout of a model of about size bytes.
func FromCheckpoint(ck *sdk.Checkpoint, size int64) (*State, error) {
	want, err := layout(size)
	if err != nil {
		return nil, err
	}
	if len(ck.Tensors) != len(want) {
		return nil, fmt.Errorf("demo: checkpoint of step %d has %d tensors, the model %d", ck.Step, len(ck.Tensors), len(want))
	}
	s := &State{Tensors: want}
	for i, w := range want {
		got := ck.Tensor(w.Name)
		if got == nil {
			return nil, fmt.Errorf("demo: checkpoint of step %d has no tensor %s", ck.Step, w.Name)
		}
		if got.DType != w.DType || !slices.Equal(got.Shape, w.Shape) {
			return nil, fmt.Errorf("demo: checkpoint tensor %s is %s%v, the model's %s%v (another --size?)",
				w.Name, got.DType, got.Shape, w.DType, w.Shape)
		}
		s.Tensors[i].Data = got.Data
	}
	if err := json.Unmarshal(ck.Objects, &s.Obj); err != nil {
		return nil, fmt.Errorf("demo: objects of step %d: %w", ck.Step, err)
	}
	if s.Obj.Step != ck.Step {
		return nil, fmt.Errorf("demo: checkpoint of step %d holds objects of step %d", ck.Step, s.Obj.Step)
	}
	return s, nil
}

// Step runs one simulated training step: SGD with momentum on the first
// matrix, an exponential average on the second, the third pulled towards
// the second, all driven by noise from the RNG kept in the objects.
// Products are converted explicitly so that no compiler fuses them into
// FMAs: every build of this code computes the same bits.
func (s *State) Step() {
	r := xorshift(&s.Obj.RNG)
	w0, w1, w2 := s.Tensors[tEmbed].Data, s.Tensors[tMLP].Data, s.Tensors[tHead].Data
	m := s.Tensors[tMomentum].Data
	for i := range len(w0) / 4 {
		x := mix(r, i)
		a, b, c := f32(w0, i), f32(w1, i), f32(w2, i)
		g := float32(0.1*noise(uint32(x>>32))) + float32(0.01*a)
		mv := float32(0.9*bf16(m, i)) + g
		putBF16(m, i, mv)
		putF32(w0, i, a-float32(lr*mv))
		b = float32(0.999*b) + float32(0.001*noise(uint32(x)))
		putF32(w1, i, b)
		putF32(w2, i, c-float32(lr*(c-b)))
	}
	cur := s.Tensors[tCursor].Data
	for k := range cursorLen {
		v := binary.LittleEndian.Uint64(cur[8*k:]) + 1 + (r>>(k%61))&7
		binary.LittleEndian.PutUint64(cur[8*k:], v)
	}
	s.Obj.Step++
	s.Obj.Loss = s.loss()
}

// loss is a cheap summary of the state: the mean of w0² + (w2-w1)² over
// every 64th element.
func (s *State) loss() float64 {
	w0, w1, w2 := s.Tensors[tEmbed].Data, s.Tensors[tMLP].Data, s.Tensors[tHead].Data
	var sum float64
	var n int
	for i := 0; i < len(w0)/4; i += 64 {
		a, d := float64(f32(w0, i)), float64(f32(w2, i)-f32(w1, i))
		sum += float64(a*a) + float64(d*d)
		n++
	}
	return sum / float64(n)
}

// Digest hashes the whole state: every tensor's name, dtype, shape and
// checksum (shm's, over all its bytes) and the objects' JSON.
func (s *State) Digest() string {
	copies := make([]shm.Copy, len(s.Tensors))
	for i, t := range s.Tensors {
		copies[i] = shm.Copy{Src: t.Data}
	}
	sums := shm.CopyAndSum(copies, 0)
	h := xxh3.New()
	for i, t := range s.Tensors {
		fmt.Fprintf(h, "%s %s %v %016x\n", t.Name, t.DType, t.Shape, sums[i])
	}
	obj, err := json.Marshal(s.Obj)
	if err != nil {
		panic(err) // three numbers always encode, the loss being finite
	}
	h.Write(obj)
	return shm.FormatSum(h.Sum64())
}

// Reference runs the training from a fresh state for steps steps without
// saving anything and returns the digest after every step (index 0 is the
// initial state).
func Reference(size int64, steps int64) ([]string, error) { return RankReference(size, 0, steps) }

// RankReference is Reference for one rank.
func RankReference(size int64, rank uint32, steps int64) ([]string, error) {
	s, err := NewRankState(size, rank)
	if err != nil {
		return nil, err
	}
	out := []string{s.Digest()}
	for s.Obj.Step < steps {
		s.Step()
		out = append(out, s.Digest())
	}
	return out, nil
}

// xorshift advances a xorshift64 state and returns the new value.
func xorshift(state *uint64) uint64 {
	x := *state
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	*state = x
	return x
}

// mix derives 64 well-mixed bits for element i from a step's random value.
func mix(r uint64, i int) uint64 {
	x := r ^ uint64(i)*0x9e3779b97f4a7c15
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	return x ^ x>>29
}

// noise maps 32 random bits to [-1, 1).
func noise(u uint32) float32 { return float32(int32(u)) * (1.0 / (1 << 31)) }

func f32(b []byte, i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }

func putF32(b []byte, i int, v float32) {
	binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
}

func bf16(b []byte, i int) float32 {
	return math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16)
}

// putBF16 stores v as bfloat16, rounding to nearest even (v is finite).
func putBF16(b []byte, i int, v float32) {
	u := math.Float32bits(v)
	u += 0x7fff + (u>>16)&1
	binary.LittleEndian.PutUint16(b[2*i:], uint16(u>>16))
}
