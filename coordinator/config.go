package coordinator

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/membership"
	"rewind.dev/rewind/tiers"
)

// Config configures a coordinator.
type Config struct {
	// ListenAddr is the gRPC address agents and operators dial.
	ListenAddr string
	// MetricsAddr serves Prometheus /metrics; empty disables it.
	MetricsAddr string
	// DataDir holds the pebble store.
	DataDir string
	// AgentTimeout bounds each call the coordinator makes to an agent
	// (verify, delete).
	AgentTimeout time.Duration
	// Policy is the tier policy of jobs that set none (tiers.ParsePolicy).
	Policy tiers.Policy
	// Replicas is how many other nodes keep a copy of each shard in shared
	// memory, for jobs that set none.
	Replicas int
	// Gossip, when set, makes the coordinator a member of the cluster's
	// failure detection (membership): agents declared dead are recovered.
	Gossip *membership.Config
	// LeaveGrace is how long an agent that left the cluster gracefully
	// (a restart) has to come back before its jobs are recovered.
	LeaveGrace time.Duration
	// Quorum, when set, replaces failure detection's answer to whether
	// this coordinator reaches a majority of the cluster; without a
	// majority, no node is declared dead from here.
	Quorum func() bool

	// Leading, when set, says whether this replica holds the leader
	// lease: only the leader serves (leader.go). Nil: always serving.
	Leading func() bool

	// Faults, when set, fires the armed fault points of the coordinator
	// (faultinject); nil unless the daemon runs with --fault-injection.
	Faults *faultinject.Injector

	Clock    clock.Clock
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// DefaultConfig returns a coordinator configuration for one cluster.
func DefaultConfig() Config {
	return Config{
		ListenAddr:   ":7080",
		MetricsAddr:  ":9465",
		DataDir:      "/var/lib/rewind/coordinator",
		AgentTimeout: 2 * time.Minute, // verifying a large shard reads every byte
		Policy:       tiers.DefaultPolicy(),
		Replicas:     1,                // survives any one node; a second costs another shard of memory per rank
		LeaveGrace:   10 * time.Second, // an agent restart takes about a second
	}
}

// Validate checks the configuration and fills in the parts left nil.
func (c *Config) Validate() error {
	var errs []error
	if c.ListenAddr == "" {
		errs = append(errs, errors.New("listen address is empty"))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data directory is empty"))
	}
	if c.AgentTimeout <= 0 {
		errs = append(errs, fmt.Errorf("agent timeout %v must be positive", c.AgentTimeout))
	}
	if c.Replicas < 0 || c.Replicas > 8 {
		errs = append(errs, fmt.Errorf("replicas %d out of range [0, 8]", c.Replicas))
	}
	if err := c.Policy.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("coordinator: invalid config: %w", err)
	}
	if c.Clock == nil {
		c.Clock = clock.Real
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	return nil
}
