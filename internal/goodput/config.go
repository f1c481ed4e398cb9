// Package goodput is `rewind-dev bench goodput`: a long run of simulated
// training ranks on a local cluster of real processes (a coordinator, agent
// processes as nodes, MinIO when built), faults injected on a seeded
// schedule, and every second of wall time accounted: useful compute, the
// in-step checkpoint cost, work lost and redone, detection, restore,
// restart. The same run is made twice, with rewind and with the baseline
// of a user of torch.save to shared storage (demo's durable-only trainer),
// and both are extrapolated to a production scenario.
package goodput

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"rewind.dev/rewind/internal/demo"
)

// Config configures a goodput run.
type Config struct {
	Exe      string // the rewind-dev binary the ranks run (demo-train); empty: this process's
	Rewind   string // the rewind binary of the coordinator and agents; empty: beside Exe
	Nodes    int
	Ranks    int
	StepTime time.Duration // simulated compute per step
	Size     int64         // state per rank, in bytes
	// BaselineEvery is the baseline's durable checkpoint interval, in steps.
	BaselineEvery int64
	FaultEvery    time.Duration // mean time between faults
	Duration      time.Duration // the run of each configuration
	// Grace bounds the wait, after Duration, for every rank to finish the
	// step it is in (or a recovery in progress to end).
	Grace time.Duration
	// HealAfter bounds the wait for a recovery before a fault is healed
	// (a hung node resumed, a partition healed, a lost node replaced).
	HealAfter time.Duration
	// MinIODown is how long MinIO stays down in its fault.
	MinIODown time.Duration
	// Faults are the kinds the schedule draws from (nil: every kind).
	Faults   []FaultKind
	Seed     uint64 // 0 picks one; the same seed replays the same schedule
	ShmDir   string
	NoMinIO  bool // leave the object store out even when built
	KeepLogs bool
	// Only runs one configuration ("rewind" or "baseline"); empty runs both.
	Only string
	// RecordFile, when set, receives every configuration's record as
	// JSON: what the accounting was computed from.
	RecordFile string
	Prod       Scenario // the production scenario the figures are extrapolated to
	Out        io.Writer
	Debug      io.Writer // the runs' timelines (nil: none)
}

// Scenario is a production scenario for the extrapolation.
type Scenario struct {
	Nodes        int
	FailureEvery time.Duration // mean time between node failures of the job
	StepTime     time.Duration
}

// DefaultConfig returns what `make goodput` runs.
func DefaultConfig() Config {
	return Config{
		Nodes: 4, Ranks: 8, // two ranks per node
		StepTime:      time.Second,
		Size:          32 << 20,
		BaselineEvery: 20, // rewind saves every step, at memory speed; the baseline's durable save is near Young's optimum sqrt(2·C·MTBF) for a durable save of a second or two every 5 minutes
		FaultEvery:    5 * time.Minute,
		Duration:      10 * time.Minute,
		Grace:         time.Minute,
		HealAfter:     30 * time.Second, // well past detection and recovery (seconds)
		MinIODown:     30 * time.Second, // several tier copies' worth
		ShmDir:        "/dev/shm",
		Prod:          Scenario{Nodes: 1024, FailureEvery: 2 * time.Hour, StepTime: 10 * time.Second},
		Out:           os.Stdout,
	}
}

// QuickConfig is DefaultConfig shortened to a smoke test of about two
// minutes in all.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Size, c.Duration, c.FaultEvery, c.HealAfter, c.MinIODown, c.BaselineEvery = 8<<20, 50*time.Second, 25*time.Second, 10*time.Second, 10*time.Second, 10
	return c
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Nodes < 3 {
		errs = append(errs, fmt.Errorf("%d nodes: want at least 3 (a node is lost, a majority lives)", c.Nodes))
	}
	if c.Ranks < 2 {
		errs = append(errs, fmt.Errorf("%d ranks: want at least 2", c.Ranks))
	}
	if c.Size < demo.MinSize {
		errs = append(errs, fmt.Errorf("state %d bytes: want at least %d", c.Size, demo.MinSize))
	}
	if c.StepTime < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("step time %v: want at least 10ms", c.StepTime))
	}
	if c.BaselineEvery < 1 {
		errs = append(errs, fmt.Errorf("baseline checkpoint every %d steps: want at least 1", c.BaselineEvery))
	}
	if c.FaultEvery < 2*c.HealAfter || c.HealAfter < 5*time.Second {
		errs = append(errs, fmt.Errorf("a fault every %v, healed after %v: want heal-after at least 5s and faults at least twice that apart", c.FaultEvery, c.HealAfter))
	}
	if c.Duration < c.FaultEvery/2 || c.Duration > 24*time.Hour {
		errs = append(errs, fmt.Errorf("duration %v: want at least half the fault interval (%v), at most a day", c.Duration, c.FaultEvery))
	}
	if c.Only != "" && c.Only != modeRewind && c.Only != modeBaseline {
		errs = append(errs, fmt.Errorf("only %q: want %q or %q", c.Only, modeRewind, modeBaseline))
	}
	if c.Prod.Nodes < 1 || c.Prod.FailureEvery <= 0 || c.Prod.StepTime <= 0 {
		errs = append(errs, fmt.Errorf("production scenario %+v: want nodes, failure interval and step time above 0", c.Prod))
	}
	if c.ShmDir == "" || c.Out == nil {
		errs = append(errs, errors.New("no shm directory or no output"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("goodput: invalid config: %w", err)
	}
	return nil
}

// The two configurations of a run.
const (
	modeRewind   = "rewind"
	modeBaseline = "baseline"
)
