package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/sdk"
)

// TrainConfig configures the demo's training process (rewind-dev demo-train).
type TrainConfig struct {
	Socket string // the agent's socket
	Job    string // job id
	Rank   uint32 // this process's rank of the job
	World  uint32 // the job's world size
	// RestoreStep, when not negative, is the step to resume from (a
	// recovery names it); otherwise the job's latest consistent step.
	RestoreStep int64
	Steps       int64         // train until this step is saved
	Size        int64         // bytes of model state
	StepTime    time.Duration // simulated compute per step, the update included
	Out         io.Writer     // the report, one line per event (see events.go)
	// PerturbRestore flips one bit of the state after a restore: a broken
	// resume, for tests that check the demo notices one. Never set otherwise.
	PerturbRestore bool
	// DurableDir, when set, makes the rank checkpoint as a user of
	// torch.save to shared storage does, every DurableEvery steps into
	// this directory, and resume from there only (durable.go): the
	// baseline of the goodput benchmark.
	DurableDir   string
	DurableEvery int64
	// Elastic makes the model one global state sharded by rows over the
	// ranks (elastic.go), Size its global size: a gang of another world
	// size restores its rows by resharding.
	Elastic bool
}

// DefaultTrainConfig returns the trainer's configuration for `rewind-dev demo`.
func DefaultTrainConfig() TrainConfig {
	return TrainConfig{
		Job:         "demo",
		World:       1,
		RestoreStep: -1,
		Steps:       30,                     // enough for two crashes and a finish
		Size:        64 << 20,               // a save takes milliseconds, not seconds
		StepTime:    100 * time.Millisecond, // a step long enough for a kill to land anywhere in it
	}
}

// Validate checks the configuration.
func (c TrainConfig) Validate() error {
	var errs []error
	if c.Steps < 1 {
		errs = append(errs, fmt.Errorf("steps %d: want at least 1", c.Steps))
	}
	if c.World < 1 || c.Rank >= c.World {
		errs = append(errs, fmt.Errorf("rank %d of world size %d", c.Rank, c.World))
	}
	if c.Size < MinSize {
		errs = append(errs, fmt.Errorf("size %d bytes: want at least %d", c.Size, MinSize))
	}
	if c.StepTime < 0 {
		errs = append(errs, fmt.Errorf("step time %v is negative", c.StepTime))
	}
	if c.DurableDir != "" && c.DurableEvery < 1 {
		errs = append(errs, fmt.Errorf("durable checkpoint every %d steps: want at least 1", c.DurableEvery))
	}
	if c.Out == nil {
		errs = append(errs, errors.New("no output"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("demo: trainer: %w", err)
	}
	return nil
}

// Train is the simulated training job: it restores the rank's latest
// checkpoint (or starts fresh when there is none), then computes and saves
// one step after another until cfg.Steps, reporting each on cfg.Out.
func Train(ctx context.Context, cfg TrainConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := sdk.Dial(dctx, cfg.Socket)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	sess, err := c.Session(cfg.Job, cfg.Rank, cfg.World)
	if err != nil {
		return err
	}
	defer sess.Close()
	if cfg.DurableDir != "" {
		return trainDurable(ctx, sess, cfg)
	}
	var st trainState
	if cfg.Elastic {
		st, err = resumeElastic(ctx, sess, cfg)
	} else {
		st, err = resume(ctx, sess, cfg)
	}
	if err != nil {
		return err
	}
	for st.at() < cfg.Steps {
		if err := lockstep(ctx, sess, cfg, st.at()); err != nil {
			return err
		}
		t0 := time.Now()
		st.advance()
		if err := clock.Sleep(ctx, cfg.StepTime-time.Since(t0)); err != nil {
			return err
		}
		compute := time.Since(t0)
		tensors, objects := st.parts()
		if err := sess.Save(ctx, st.at(), tensors, objects); err != nil {
			if ctx.Err() != nil || errors.Is(err, sdk.ErrGangBroken) {
				fmt.Fprintln(cfg.Out, formatSaveFailed(st.at(), err))
				return err // the job is being recovered: exit, to be restarted
			}
			// A failed save is logged and survived: training goes on.
			fmt.Fprintln(cfg.Out, formatSaveFailed(st.at(), err))
			continue
		}
		ls := sess.LastSave()
		fmt.Fprintln(cfg.Out, formatSaved(st.at(), compute, ls.Bytes, ls.Total, ls.Cold, st.digest()))
	}
	fmt.Fprintln(cfg.Out, formatDone(st.at(), st.digest()))
	return nil
}

// trainState is a model the trainer runs: the demo's per-rank State, or
// a rank's rows of the elastic model.
type trainState interface {
	advance()                   // one training step
	at() int64                  // the step it holds
	parts() ([]sdk.Tensor, any) // what a save writes: tensors and objects
	digest() string             // a hash of the whole, as the report shows it
}

func (s *State) advance()                   { s.Step() }
func (s *State) at() int64                  { return s.Obj.Step }
func (s *State) parts() ([]sdk.Tensor, any) { return s.Tensors, s.Obj }
func (s *State) digest() string             { return s.Digest() }

// resume restores the latest checkpoint, or returns a fresh state when the
// rank has none, and reports which.
func resume(ctx context.Context, sess *sdk.Session, cfg TrainConfig) (*State, error) {
	t0 := time.Now()
	var ck *sdk.Checkpoint
	var err error
	if cfg.RestoreStep >= 0 {
		ck, err = sess.RestoreStep(ctx, cfg.RestoreStep)
	} else {
		ck, err = sess.Restore(ctx)
	}
	took := time.Since(t0)
	if errors.Is(err, sdk.ErrNotFound) && cfg.RestoreStep < 0 {
		st, err := NewRankState(cfg.Size, cfg.Rank)
		if err != nil {
			return nil, err
		}
		fmt.Fprintln(cfg.Out, formatFresh(st.Obj.Step, st.Digest()))
		return st, nil
	}
	if err != nil {
		return nil, err
	}
	st, err := FromCheckpoint(ck, cfg.Size)
	if err != nil {
		return nil, err
	}
	if cfg.PerturbRestore {
		// One bit of a weight, and of the RNG state so the difference
		// cannot round away in later steps.
		st.Tensors[tEmbed].Data[0] ^= 1
		st.Obj.RNG ^= 1 << 17
	}
	fmt.Fprintln(cfg.Out, formatResumed(st.Obj.Step, st.Digest(), took))
	return st, nil
}

// lockstep holds a rank of a job of several ranks until the job's latest
// consistent step is at most one behind the step it has saved, as the
// collectives of synchronous training do: ranks never drift apart by more
// than a step, so every step becomes consistent. A step some rank failed
// to save never becomes consistent, though (its save was logged and
// skipped, as a training loop does), so the wait is bounded: after
// lockstepWait the rank goes on, as real training would, its collectives
// not depending on checkpoints. Without the bound, ranks that skipped
// different steps would each wait for a step that can never complete.
func lockstep(ctx context.Context, sess *sdk.Session, cfg TrainConfig, saved int64) error {
	if cfg.World < 2 || saved < 1 {
		return nil
	}
	deadline := time.Now().Add(lockstepWait(cfg))
	for {
		step, ok, err := sess.LatestConsistent(ctx)
		if errors.Is(err, sdk.ErrGangBroken) {
			fmt.Fprintln(cfg.Out, formatSaveFailed(saved+1, err))
			return err
		}
		if err == nil && ok && step >= saved-1 {
			return nil
		}
		if time.Now().After(deadline) {
			return nil // step saved-1 will not complete: go on
		}
		if err := clock.Sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
}

// lockstepWait bounds lockstep's wait: far above the time a step takes to
// become consistent (a few report round trips), so that ranks stay in step
// while saves succeed.
func lockstepWait(cfg TrainConfig) time.Duration {
	return max(time.Second, 10*cfg.StepTime)
}
