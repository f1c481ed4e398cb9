package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/membership"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// Config configures an agent.
type Config struct {
	// Node names this node in listings and, later, in the cluster.
	Node string
	// ShmRoot is the directory on tmpfs that holds the segments.
	ShmRoot string
	// Socket is the Unix socket the SDK dials.
	Socket string
	// SocketGroup, when set, makes the socket and segments readable and
	// writable by this group (0660) instead of by the owner only (0600).
	SocketGroup string
	// ListenAddr is the TCP address for peers and the coordinator; empty
	// disables it.
	ListenAddr string
	// MetricsAddr serves Prometheus /metrics over HTTP; empty disables it.
	MetricsAddr string
	// CoordinatorAddr is the coordinator's gRPC address; empty runs the
	// agent alone (a single node, or tests).
	CoordinatorAddr string
	// AdvertiseAddr is the address the coordinator and peers use to reach
	// this agent's TCP listener; empty derives it from the node name and
	// ListenAddr's port.
	AdvertiseAddr string
	// FailureDomain names what fails together with this node (a rack, a
	// switch); replicas are placed outside it.
	FailureDomain string
	// BudgetBytes caps the bytes of all segments on the node; 0 means the
	// size of the shared-memory file system.
	BudgetBytes uint64
	// SlotsPerRank is how many segments each rank rotates through.
	SlotsPerRank int
	// VerifyWorkers is how many goroutines verify checksums.
	VerifyWorkers int
	// VerifyAfterCommit re-reads every committed shard in the background.
	VerifyAfterCommit bool
	// PinWait bounds how long a save whose only free slot holds the job's
	// latest consistent step waits for the coordinator to move that step
	// on (the other ranks' reports arriving), before failing with ErrBusy.
	PinWait time.Duration
	// LeaseTTL bounds how long a reader that never releases its lease holds
	// a slot.
	LeaseTTL time.Duration

	// Gossip, when set, makes the agent a member of the cluster's failure
	// detection (membership), joining GossipJoin (the coordinator's
	// memberlist address, or any member's).
	Gossip     *membership.Config
	GossipJoin []string

	// WarmSegment, when positive, keeps one segment of this many bytes
	// allocated and mapped ahead of need, for a restore onto this node
	// (a spare that takes over a dead node's rank) to write into without
	// first allocating and faulting in a new one; 0 turns it off.
	WarmSegment int64

	// Stores are the durable tiers ("nvme", "pfs", "s3") this agent
	// writes when the coordinator orders it and restores from.
	Stores map[string]tiers.Store
	// TransferWorkers is how many tier transfers run at once on the node.
	TransferWorkers int
	// TransferBandwidth caps the bytes per second of all tier transfers
	// of the node together; 0 leaves them unlimited.
	TransferBandwidth int64
	// TransferAttempts bounds the attempts of one transfer; between them
	// the agent waits TransferBackoff, doubling up to 30 s, and the tier
	// shows degraded.
	TransferAttempts int
	TransferBackoff  time.Duration

	// Faults, when set, fires the armed fault points of this agent and
	// wraps FS (faultinject); nil in production unless the daemon runs
	// with --fault-injection.
	Faults *faultinject.Injector

	FS       shm.FS
	Clock    clock.Clock
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// DefaultConfig returns the configuration of a node agent on a Linux host.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Node:              host,
		ShmRoot:           "/dev/shm/rewind", // memory-backed on every Linux host and pod
		Socket:            "/run/rewind/agent.sock",
		ListenAddr:        ":7070",
		MetricsAddr:       ":9464",
		SlotsPerRank:      2, // the latest committed step plus the save in progress
		VerifyWorkers:     2, // verification runs beside training: leave it most cores
		VerifyAfterCommit: true,
		PinWait:           2 * time.Second, // reports reach the coordinator in milliseconds; this covers a restart
		LeaseTTL:          5 * time.Minute, // far above any restore copy, short enough to recover a lost reader's slot
		TransferWorkers:   2,               // one shard streams while the next starts; more only competes with training
		TransferAttempts:  8,               // with the backoff, rides out about two minutes of a store being away
		TransferBackoff:   time.Second,
	}
}

// Validate checks the configuration and fills in the parts left nil.
func (c *Config) Validate() error {
	var errs []error
	if c.Node == "" {
		errs = append(errs, errors.New("node name is empty"))
	}
	if c.ShmRoot == "" {
		errs = append(errs, errors.New("shm root is empty"))
	}
	if c.Socket == "" {
		errs = append(errs, errors.New("socket path is empty"))
	}
	if c.SlotsPerRank < 2 {
		errs = append(errs, fmt.Errorf("slots per rank is %d; at least 2 keep the latest checkpoint safe while the next is written", c.SlotsPerRank))
	}
	if c.VerifyWorkers < 1 {
		errs = append(errs, fmt.Errorf("verify workers is %d, must be at least 1", c.VerifyWorkers))
	}
	if c.PinWait < 0 {
		errs = append(errs, fmt.Errorf("pin wait %v must not be negative", c.PinWait))
	}
	if c.TransferWorkers < 1 || c.TransferAttempts < 1 || c.TransferBackoff <= 0 {
		errs = append(errs, fmt.Errorf("transfer workers %d, attempts %d and backoff %v must be positive", c.TransferWorkers, c.TransferAttempts, c.TransferBackoff))
	}
	if c.TransferBandwidth < 0 {
		errs = append(errs, fmt.Errorf("transfer bandwidth %d bytes/s must not be negative", c.TransferBandwidth))
	}
	for name := range c.Stores {
		if name != "nvme" && name != "pfs" && name != "s3" {
			errs = append(errs, fmt.Errorf("unknown tier %q: want nvme, pfs or s3", name))
		}
	}
	if c.LeaseTTL <= 0 {
		errs = append(errs, fmt.Errorf("lease TTL %v must be positive", c.LeaseTTL))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("agent: invalid config: %w", err)
	}
	if c.FS == nil {
		c.FS = shm.OSFS
	}
	c.FS = c.Faults.FS(c.FS, "shm")
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
