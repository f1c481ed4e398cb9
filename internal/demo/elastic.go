package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/zeebo/xxh3"

	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// The elastic model (TrainConfig.Elastic): one global state, two F32
// matrices of rows × elasticCols (the weights "w" and their momentum
// "v"), sharded by rows over the ranks: rank r of W holds rows
// [r·rows/W, (r+1)·rows/W), saved with chunk records that place them in
// the global matrices. Every element's update depends only on its global
// index and the step, so the state after a step is the same at every
// world size: a gang that shrinks restores its new rows by resharding
// the step its larger gang saved, and ends as an uninterrupted run.
const elasticCols = 256

// shardedState is one rank's rows of the elastic model.
type shardedState struct {
	rows, lo int64  // the global rows; this rank's first
	w, v     []byte // this rank's rows of the weights and the momentum
	step     int64
}

// elasticObjects is the elastic model's objects document.
type elasticObjects struct {
	Step int64 `json:"step"`
}

// elasticRows returns the rows of an elastic model of about size bytes.
func elasticRows(size int64) int64 { return size / (2 * 4 * elasticCols) }

// rowsOf returns rank's rows [lo, lo+n) of rows at world size world.
func rowsOf(rows int64, rank, world uint32) (lo, n int64) {
	lo = rows * int64(rank) / int64(world)
	return lo, rows*int64(rank+1)/int64(world) - lo
}

// newSharded returns rank's rows of the initial state (step 0).
func newSharded(rows int64, rank, world uint32) *shardedState {
	lo, n := rowsOf(rows, rank, world)
	s := &shardedState{rows: rows, lo: lo, w: make([]byte, 4*n*elasticCols), v: make([]byte, 4*n*elasticCols)}
	base := int(lo * elasticCols)
	for i := range int(n * elasticCols) {
		putF32(s.w, i, float32(0.02*noise(uint32(mix(initSeed, base+i)>>32))))
	}
	return s
}

// advance runs one step: momentum SGD on noise drawn per global element.
func (s *shardedState) advance() {
	s.step++
	r := mix(initSeed^0xe1a5, int(s.step))
	base := int(s.lo * elasticCols)
	for i := range len(s.w) / 4 {
		x := mix(r, base+i)
		v := float32(0.9*f32(s.v, i)) + float32(0.1*noise(uint32(x>>32)))
		putF32(s.v, i, v)
		putF32(s.w, i, f32(s.w, i)-float32(lr*v))
	}
}

func (s *shardedState) at() int64 { return s.step }

func (s *shardedState) parts() ([]sdk.Tensor, any) {
	n := int64(len(s.w)) / (4 * elasticCols)
	t := func(name string, data []byte) sdk.Tensor {
		return sdk.Tensor{Name: name, DType: shm.F32, Shape: []int64{n, elasticCols}, Data: data,
			Chunk: &shm.Chunk{GlobalShape: []int64{s.rows, elasticCols}, Offsets: []int64{s.lo, 0}}}
	}
	return []sdk.Tensor{t("w", s.w), t("v", s.v)}, elasticObjects{Step: s.step}
}

// digest hashes the rank's rows and the step: two ranks' digests are
// equal when they hold the same rows of the same state.
func (s *shardedState) digest() string {
	h := xxh3.New()
	fmt.Fprintf(h, "step %d rows %d+%d of %d\n", s.step, s.lo, int64(len(s.w))/(4*elasticCols), s.rows)
	h.Write(s.w)
	h.Write(s.v)
	return shm.FormatSum(h.Sum64())
}

// layout is the slices a restore of this rank's rows fills.
func (s *shardedState) layout() sdk.Layout {
	n := int64(len(s.w)) / (4 * elasticCols)
	sl := func(name string, data []byte) sdk.Slice {
		return sdk.Slice{Name: name, DType: shm.F32, Offsets: []int64{s.lo, 0}, Lengths: []int64{n, elasticCols}, Data: data}
	}
	return sdk.Layout{Slices: []sdk.Slice{sl("w", s.w), sl("v", s.v)}}
}

// hasStep reports whether the coordinator knows a consistent step of the
// job: then a restore's ErrNotFound is about what the step holds (a
// tensor of the layout no rank saved), not a job with nothing to resume,
// and starting fresh would throw the checkpoint away. A lone agent's
// answer (ErrBusy) or none at all says no step.
func hasStep(ctx context.Context, sess *sdk.Session) bool {
	_, ok, err := sess.LatestConsistent(ctx)
	return err == nil && ok
}

// resumeElastic restores this rank's rows of the step to resume from,
// saved at whatever world size, or starts fresh when the job has none.
func resumeElastic(ctx context.Context, sess *sdk.Session, cfg TrainConfig) (trainState, error) {
	rows := elasticRows(cfg.Size)
	if rows < int64(cfg.World) {
		return nil, fmt.Errorf("demo: elastic model of %s has %d rows, fewer than the %d ranks", units.Bytes(uint64(cfg.Size)), rows, cfg.World)
	}
	st := newSharded(rows, cfg.Rank, cfg.World)
	t0 := time.Now()
	var res *sdk.Resharded
	var err error
	if cfg.RestoreStep >= 0 {
		res, err = sess.RestoreStepInto(ctx, cfg.RestoreStep, st.layout())
	} else {
		res, err = sess.RestoreInto(ctx, st.layout())
	}
	took := time.Since(t0)
	if errors.Is(err, sdk.ErrNotFound) && cfg.RestoreStep < 0 && !hasStep(ctx, sess) {
		fmt.Fprintln(cfg.Out, formatFresh(st.step, st.digest()))
		return st, nil
	}
	if err != nil {
		return nil, err
	}
	var obj elasticObjects
	if err := json.Unmarshal(res.Objects, &obj); err != nil || obj.Step != res.Step {
		return nil, fmt.Errorf("demo: objects of step %d: %q (%v)", res.Step, res.Objects, err)
	}
	st.step = res.Step
	if cfg.PerturbRestore {
		st.w[0] ^= 1
	}
	fmt.Fprintf(cfg.Out, "resharded step %d saved by %d ranks into rank %d of %d: rows %d+%d, %s copied, %s verified\n",
		res.Step, res.SavedWorldSize, cfg.Rank, cfg.World, st.lo, int64(len(st.w))/(4*elasticCols), units.Bytes(uint64(res.Bytes)), units.Bytes(uint64(res.Verified)))
	fmt.Fprintln(cfg.Out, formatResumed(st.step, st.digest(), took))
	return st, nil
}

// ElasticReference runs the elastic model of size bytes from its initial
// state without saving and returns, for each of steps, the digest of
// every rank's rows at world size world: what a run that resharded must
// report. Steps are in ascending order.
func ElasticReference(size int64, world uint32, steps ...int64) (map[int64][]string, error) {
	rows := elasticRows(size)
	if !slices.IsSorted(steps) {
		return nil, fmt.Errorf("demo: elastic reference steps %v: want ascending", steps)
	}
	if rows < int64(world) {
		return nil, fmt.Errorf("demo: elastic model of %d rows cannot be split over %d ranks", rows, world)
	}
	whole := newSharded(rows, 0, 1)
	out := map[int64][]string{}
	for _, step := range steps {
		for whole.step < step {
			whole.advance()
		}
		for r := range world {
			lo, n := rowsOf(rows, r, world)
			part := &shardedState{rows: rows, lo: lo, step: step,
				w: whole.w[4*lo*elasticCols : 4*(lo+n)*elasticCols], v: whole.v[4*lo*elasticCols : 4*(lo+n)*elasticCols]}
			out[step] = append(out[step], part.digest())
		}
	}
	return out, nil
}
