package demo

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Config configures `rewind-dev demo single`.
type Config struct {
	// Exe is the rewind-dev binary the trainer runs from (its demo-train
	// command); empty means this process's own executable.
	Exe string
	// Rewind is the rewind binary the agent runs from; empty means the
	// rewind binary in Exe's directory.
	Rewind   string
	Steps    int64         // the trainer trains until this step
	Size     int64         // bytes of model state, saved every step
	StepTime time.Duration // simulated compute per step
	// Seed drives every random choice (when to kill what); 0 picks one.
	// The demo prints it, and the same seed replays the same choices.
	Seed uint64
	// The trainer is killed after a random step in [KillMin, KillMax].
	KillMin, KillMax int64
	ShmDir           string // tmpfs in which the demo makes its shm root
	Out              io.Writer
	// TrainerArgs are extra arguments for every trainer; tests use them to
	// break the trainer on purpose.
	TrainerArgs []string
}

// DefaultConfig returns the configuration `make demo` runs with.
func DefaultConfig() Config {
	t := DefaultTrainConfig()
	return Config{
		Steps:    t.Steps,
		Size:     t.Size,
		StepTime: t.StepTime,
		KillMin:  8,          // a few warm saves first, so their timings show
		KillMax:  14,         // leaves room for the agent's crash and a finish
		ShmDir:   "/dev/shm", // memory-backed on every Linux host
		Out:      os.Stdout,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Size < MinSize {
		errs = append(errs, fmt.Errorf("size %d bytes: want at least %d", c.Size, MinSize))
	}
	if c.StepTime < 0 {
		errs = append(errs, fmt.Errorf("step time %v is negative", c.StepTime))
	}
	if c.KillMin < 1 || c.KillMax < c.KillMin {
		errs = append(errs, fmt.Errorf("kill range [%d, %d]: want 1 <= min <= max", c.KillMin, c.KillMax))
	}
	// After the trainer's kill at KillMax (resumed at most two steps later)
	// the agent is killed at least one step after the resume and at most at
	// Steps-2, and the last run still trains a step.
	if c.Steps < c.KillMax+5 {
		errs = append(errs, fmt.Errorf("steps %d: want at least the kill range's max + 5 = %d", c.Steps, c.KillMax+5))
	}
	if c.ShmDir == "" {
		errs = append(errs, errors.New("no shm directory"))
	}
	if c.Out == nil {
		errs = append(errs, errors.New("no output"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("demo: invalid config: %w", err)
	}
	return nil
}
