package demo

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/sdk"
)

// Durable-only checkpointing, the baseline of `rewind-dev bench goodput`:
// the training loop of a user of torch.save to shared storage. Every
// DurableEvery steps the rank writes its whole state to a file of its own
// under DurableDir (write, fsync, rename: the step blocks until it is
// durable), and a restart resumes from the newest step whose file every
// rank has, whatever rewind holds in memory. The rank still saves a small
// heartbeat state through rewind every step, so that the same failure
// detection and re-gang restart it (and nothing else of rewind is used);
// the heartbeat's step numbers are rewind's, apart from the training
// step.

// heartbeatSize is the heartbeat's state: the model's smallest layout.
const heartbeatSize = MinSize

// trainDurable is Train for a rank with cfg.DurableDir set.
func trainDurable(ctx context.Context, sess *sdk.Session, cfg TrainConfig) error {
	hb, err := NewRankState(heartbeatSize, cfg.Rank)
	if err != nil {
		return err
	}
	// The heartbeat is restored as any rank restores (the recovery's step,
	// else the latest consistent one): that joins the new gang.
	t0 := time.Now()
	hbStep := int64(0)
	var ck *sdk.Checkpoint
	if cfg.RestoreStep >= 0 {
		ck, err = sess.RestoreStep(ctx, cfg.RestoreStep)
	} else {
		ck, err = sess.Restore(ctx)
	}
	switch {
	case err == nil:
		hbStep = ck.Step
	case !errors.Is(err, sdk.ErrNotFound) || cfg.RestoreStep >= 0:
		return err
	}
	st, err := loadDurable(cfg)
	took := time.Since(t0)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if st, err = NewRankState(cfg.Size, cfg.Rank); err != nil {
			return err
		}
		fmt.Fprintln(cfg.Out, formatFresh(st.Obj.Step, st.Digest()))
	case err != nil:
		return err
	default:
		fmt.Fprintln(cfg.Out, formatResumed(st.Obj.Step, st.Digest(), took))
	}
	for st.Obj.Step < cfg.Steps {
		if err := lockstep(ctx, sess, cfg, hbStep); err != nil {
			return err
		}
		t0 := time.Now()
		st.Step()
		if err := clock.Sleep(ctx, cfg.StepTime-time.Since(t0)); err != nil {
			return err
		}
		compute := time.Since(t0)
		t1 := time.Now()
		bytes := int64(heartbeatSize)
		if st.Obj.Step%cfg.DurableEvery == 0 {
			if err := writeDurable(cfg, st); err != nil {
				return err // a torch.save that fails ends the job
			}
			bytes = cfg.Size
		}
		hbStep++
		if err := sess.Save(ctx, hbStep, hb.Tensors, hb.Obj); err != nil {
			fmt.Fprintln(cfg.Out, formatSaveFailed(st.Obj.Step, err))
			if ctx.Err() != nil || errors.Is(err, sdk.ErrGangBroken) {
				return err
			}
			continue
		}
		fmt.Fprintln(cfg.Out, formatSaved(st.Obj.Step, compute, bytes, time.Since(t1), sess.LastSave().Cold, st.Digest()))
	}
	fmt.Fprintln(cfg.Out, formatDone(st.Obj.Step, st.Digest()))
	return nil
}

// durablePath is the file of a rank's step.
func durablePath(dir string, rank uint32, step int64) string {
	return filepath.Join(dir, fmt.Sprintf("rank-%d", rank), fmt.Sprintf("step-%012d.ckpt", step))
}

// writeDurable writes the state as the file of its step: every tensor's
// bytes in the model's order, the objects' JSON, and the JSON's length
// (8 bytes, little endian); synced, then renamed into place and the
// directory synced. The rank's files older than the one before are
// removed.
func writeDurable(cfg TrainConfig, st *State) error {
	path := durablePath(cfg.DurableDir, cfg.Rank, st.Obj.Step)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("demo: durable checkpoint: %w", err)
	}
	obj, err := json.Marshal(st.Obj)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("demo: durable checkpoint: %w", err)
	}
	for _, t := range st.Tensors {
		if _, err = f.Write(t.Data); err != nil {
			break
		}
	}
	if err == nil {
		_, err = f.Write(binary.LittleEndian.AppendUint64(obj, uint64(len(obj))))
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		return fmt.Errorf("demo: durable checkpoint of rank %d step %d: %w", cfg.Rank, st.Obj.Step, err)
	}
	steps, _ := durableSteps(filepath.Dir(path))
	for _, s := range steps[min(2, len(steps)):] { // newest first: keep two
		os.Remove(durablePath(cfg.DurableDir, cfg.Rank, s))
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// durableSteps lists the steps of the complete files in a rank's
// directory, newest first.
func durableSteps(dir string) ([]int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var steps []int64
	for _, e := range ents {
		s, isStep := strings.CutPrefix(e.Name(), "step-")
		s, isCkpt := strings.CutSuffix(s, ".ckpt")
		if !isStep || !isCkpt { // a file being written ends in .tmp
			continue
		}
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			steps = append(steps, n)
		}
	}
	slices.Sort(steps)
	slices.Reverse(steps)
	return steps, nil
}

// loadDurable reads the rank's newest step whose file every rank of the
// job has; an error wrapping os.ErrNotExist when there is none.
func loadDurable(cfg TrainConfig) (*State, error) {
	steps, err := durableSteps(filepath.Dir(durablePath(cfg.DurableDir, cfg.Rank, 0)))
	if err != nil {
		return nil, fmt.Errorf("demo: durable checkpoints: %w", err)
	}
	for _, s := range steps {
		whole := true
		for r := range cfg.World {
			if _, err := os.Stat(durablePath(cfg.DurableDir, r, s)); err != nil {
				whole = false
				break
			}
		}
		if whole {
			return readDurable(cfg, s)
		}
	}
	return nil, fmt.Errorf("demo: no durable checkpoint of every rank in %s: %w", cfg.DurableDir, os.ErrNotExist)
}

// readDurable reads the rank's file of step (see writeDurable).
func readDurable(cfg TrainConfig, step int64) (*State, error) {
	path := durablePath(cfg.DurableDir, cfg.Rank, step)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("demo: durable checkpoint: %w", err)
	}
	ts, err := layout(cfg.Size)
	if err != nil {
		return nil, err
	}
	st, off := &State{Tensors: ts}, 0
	for i := range ts {
		n := len(ts[i].Data)
		if off+n > len(b) {
			return nil, fmt.Errorf("demo: durable checkpoint %s is short (another --size?)", path)
		}
		ts[i].Data, off = b[off:off+n], off+n
	}
	if len(b)-off < 8 || uint64(len(b)-off-8) != binary.LittleEndian.Uint64(b[len(b)-8:]) {
		return nil, fmt.Errorf("demo: durable checkpoint %s: bad objects trailer", path)
	}
	if err := json.Unmarshal(b[off:len(b)-8], &st.Obj); err != nil || st.Obj.Step != step {
		return nil, fmt.Errorf("demo: durable checkpoint %s: objects of step %d (%v)", path, st.Obj.Step, err)
	}
	return st, nil
}
