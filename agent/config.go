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
	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/membership"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
	"rewind.dev/rewind/transport"
	"rewind.dev/rewind/vfs"
)

// Config configures an agent.
type Config struct {
	// Node names this node in listings and in the cluster: a host name
	// or Kubernetes node name (shm.ValidateNode says the rule).
	Node string
	// ShmRoot is the directory on tmpfs that holds the segments.
	ShmRoot string
	// Socket is the Unix socket the SDK dials. Its directory is created
	// if missing, that one directory only: its parent must exist and not
	// be the file system's root.
	Socket string
	// SocketGroup, when set, makes the sockets (gRPC and segments)
	// usable by this group (0660) instead of by the owner only (0600).
	// Segments stay the agent's alone either way: a rank gets a segment's
	// file descriptor over the segment socket (segserver.go).
	SocketGroup string
	// JobKeys, when set, isolates jobs on the socket: a call over it is
	// served only with the token of the job it names (jobtoken), and a
	// segment is handed only to a holder of its job's token. Without keys
	// every process that can open the socket reaches every job's
	// checkpoints; the agent logs so at start.
	JobKeys jobtoken.Keys
	// ListenAddr is the TCP address for peers and the coordinator; empty
	// disables it. Without TLS it must be a loopback address unless
	// Transport is insecure.
	ListenAddr string
	// Transport protects the TCP listener and every connection the agent
	// dials (the coordinator, peers); nil is plaintext on loopback only.
	Transport *transport.Security
	// MetricsAddr serves Prometheus /metrics over HTTP; empty disables it.
	MetricsAddr string
	// CoordinatorAddr is the coordinator's gRPC address; empty runs the
	// agent alone (a single node, or tests).
	CoordinatorAddr string
	// AdvertiseAddr is the address the coordinator and peers use to reach
	// this agent's TCP listener; empty derives it from the node name and
	// ListenAddr's port, or is ListenAddr itself when that is a loopback
	// address.
	AdvertiseAddr string
	// FailureDomain names what fails together with this node (a rack, a
	// switch); replicas are placed outside it.
	FailureDomain string
	// BudgetBytes caps the bytes of all segments on the node; 0 means the
	// size of the shared-memory file system.
	BudgetBytes uint64
	// JobBudgetBytes caps the bytes of one job's segments on the node, its
	// own ranks' and its replicas, within BudgetBytes: one job's saves
	// cannot take the memory another job on the node needs. 0: no cap.
	JobBudgetBytes uint64
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
	// PrepareTTL is how long a Prepare holds its segment without a
	// Commit: after it, a save that finds no budget takes the segment
	// back (prepares.go).
	PrepareTTL time.Duration

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

	// Stores are the durable tiers this agent writes when the
	// coordinator orders it and restores from.
	Stores map[tiers.Name]tiers.Store
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

	FS     vfs.FS
	Clock  clock.Clock
	Logger *slog.Logger
	// Registry takes the agent's metrics, served on MetricsAddr; nil
	// gives each agent New makes a registry of its own.
	Registry prometheus.Registerer
}

// DefaultConfig returns the configuration of a node agent on a Linux host.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Node:              host,
		ShmRoot:           "/dev/shm/rewind",        // memory-backed on every Linux host and pod
		Socket:            "/run/rewind/agent.sock", // runtime state of a system daemon (FHS), where ranks on the host find it
		ListenAddr:        "127.0.0.1:7070",         // loopback until TLS or --insecure is chosen: a cluster sets --listen :7070 with its certificates
		MetricsAddr:       "127.0.0.1:9464",         // Prometheus's exporter range; loopback like ListenAddr until TLS or --insecure
		SlotsPerRank:      2,                        // the latest committed step plus the save in progress
		VerifyWorkers:     2,                        // verification runs beside training: leave it most cores
		VerifyAfterCommit: true,                     // a shard rotting in memory is found before a restore needs it
		PinWait:           2 * time.Second,          // reports reach the coordinator in milliseconds; this covers a restart
		LeaseTTL:          5 * time.Minute,          // far above any restore copy, short enough to recover a lost reader's slot
		PrepareTTL:        10 * time.Minute,         // a save's copy into memory takes seconds (a 100 GiB shard at a slow 1 GiB/s is under 2 min); a rank gone for 10 min is not coming back to commit
		TransferWorkers:   2,                        // one shard streams while the next starts; more only competes with training
		TransferAttempts:  8,                        // with the backoff, rides out about two minutes of a store being away
		TransferBackoff:   time.Second,              // a store's blip is over by the first retry; doubling reaches 30 s by the sixth
		FS:                vfs.Default,              // the host's; tests and faultinject wrap it
		Clock:             clock.Real,               // tests pass a fake one
		Logger:            slog.Default(),           // the daemon passes its own
	}
}

// Validate reports what is wrong with the configuration; it changes
// nothing.
func (c Config) Validate() error {
	var errs []error
	if err := shm.ValidateNode(c.Node); err != nil {
		errs = append(errs, err)
	}
	if c.ShmRoot == "" {
		errs = append(errs, errors.New("shm root is empty"))
	}
	if c.Socket == "" {
		errs = append(errs, errors.New("socket path is empty"))
	}
	if c.ListenAddr != "" {
		if err := c.Transport.CheckAddr("listen on", c.ListenAddr); err != nil {
			errs = append(errs, err)
		}
	}
	if c.CoordinatorAddr != "" {
		if err := c.Transport.CheckAddr("dial the coordinator at", c.CoordinatorAddr); err != nil {
			errs = append(errs, err)
		}
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
		if _, err := tiers.ParseName(string(name)); err != nil {
			errs = append(errs, err)
		}
	}
	if c.LeaseTTL <= 0 {
		errs = append(errs, fmt.Errorf("lease TTL %v must be positive", c.LeaseTTL))
	}
	if c.PrepareTTL <= 0 {
		errs = append(errs, fmt.Errorf("prepare TTL %v must be positive", c.PrepareTTL))
	}
	if c.FS == nil || c.Clock == nil || c.Logger == nil {
		errs = append(errs, errors.New("file system, clock and logger must be set (DefaultConfig sets them)"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("agent: invalid config: %w", err)
	}
	return nil
}
