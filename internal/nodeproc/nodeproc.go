// Package nodeproc is the rank supervisor of `rewind node`: on a node that
// runs its agent and the job's ranks together (a container of the compose
// cluster), it runs the ranks the coordinator places on this node as
// processes (`rewind-dev demo-train`), restarts them on a recovery's
// placement (regang.Follow with a regang.Node driver), and writes their
// report to its own output, one line per event, prefixed by the rank:
//
//	[rank 1] step 13 compute 250.3 ms saved 4.0 MiB in 3.1 ms digest 77b0...
//	[rank 1 stderr] rewind-dev demo-train: ...
//	[node] start rank 1 (restore step 12, recovery)
//
// so that `docker logs` of the container is the job's report.
package nodeproc

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// Config configures a node's rank supervisor.
type Config struct {
	Node      string // this node's name, as the coordinator knows it
	Job       string
	WorldSize uint32
	// InitialRanks are the ranks this node starts when the job is new (the
	// coordinator knows no placement for them elsewhere).
	InitialRanks []uint32
	Exe          string   // the binary whose demo-train command is a rank (rewind-dev)
	Socket       string   // the agent's SDK socket
	TrainArgs    []string // more demo-train flags: --steps, --size, --step-time
	API          coordpb.CoordinatorClient
	Out          io.Writer // the ranks' report and the supervisor's events
	Logger       *slog.Logger

	// JobToken is the job's token (jobtoken), handed to every rank as
	// $REWIND_JOB_TOKEN; empty for an agent that does not isolate jobs.
	JobToken string

	// Reconcile is how often the supervisor compares what it runs with the
	// coordinator's placement (a recovery event missed during a partition).
	Reconcile time.Duration
	// MovedStrikes is how many reconciles in a row must see a running rank
	// placed elsewhere before it is killed (placement changes a moment
	// before the recovery's event arrives).
	MovedStrikes int
	// RestartAfter is how long a rank placed here may stay stopped (exited
	// by itself, not done, and no recovery started it) before the
	// supervisor restarts it from the latest consistent step.
	RestartAfter time.Duration
	// StartTimeout bounds the wait for the agent and the coordinator at
	// start-up.
	StartTimeout time.Duration
}

// DefaultConfig returns the timings `rewind node` runs with.
func DefaultConfig() Config {
	return Config{
		Reconcile:    time.Second,      // a missed recovery costs at most a second more
		MovedStrikes: 2,                // placement is recorded about a restore's time before the event
		RestartAfter: 15 * time.Second, // well past a recovery's restore, so a recovery always acts first
		StartTimeout: 2 * time.Minute,  // containers start in any order on a busy host
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Node == "" || c.Job == "" || c.Exe == "" || c.Socket == "" {
		errs = append(errs, fmt.Errorf("node %q, job %q, binary %q and socket %q must all be set", c.Node, c.Job, c.Exe, c.Socket))
	}
	if c.WorldSize < 1 {
		errs = append(errs, errors.New("world size must be at least 1"))
	}
	for _, r := range c.InitialRanks {
		if r >= c.WorldSize {
			errs = append(errs, fmt.Errorf("initial rank %d is not below the world size %d", r, c.WorldSize))
		}
	}
	if c.API == nil || c.Out == nil || c.Logger == nil {
		errs = append(errs, errors.New("coordinator client, output and logger must be set"))
	}
	if c.Reconcile <= 0 || c.MovedStrikes < 1 || c.RestartAfter <= 0 || c.StartTimeout <= 0 {
		errs = append(errs, fmt.Errorf("reconcile %v, moved strikes %d, restart-after %v and start timeout %v must be positive",
			c.Reconcile, c.MovedStrikes, c.RestartAfter, c.StartTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nodeproc: invalid config: %w", err)
	}
	return nil
}
