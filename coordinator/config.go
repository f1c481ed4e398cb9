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
	"rewind.dev/rewind/transport"
)

// Config configures a coordinator.
type Config struct {
	// ListenAddr is the gRPC address agents and operators dial. Without
	// TLS it must be a loopback address unless Transport is insecure.
	ListenAddr string
	// Transport protects the gRPC listener and the connections the
	// coordinator dials to agents; nil is plaintext on loopback only.
	Transport *transport.Security
	// MetricsAddr serves Prometheus /metrics; empty disables it.
	MetricsAddr string
	// DataDir holds the pebble store.
	DataDir string
	// AgentTimeout bounds each call the coordinator makes to an agent
	// (verify, delete).
	AgentTimeout time.Duration
	// RecoveryRetries is how many times in a row a recovery that fails
	// after its plan is tried again, after 1 s doubling to 30 s (retry.go),
	// before its job waits for a node to come back or an operator's
	// restore; 0: not tried again.
	RecoveryRetries int
	// Policy is the tier policy of jobs that set none (tiers.ParsePolicy).
	Policy tiers.Policy
	// Replicas is how many other nodes keep a copy of each shard in shared
	// memory, for jobs that set none.
	Replicas int
	// Gossip, when set, makes the coordinator a member of the cluster's
	// failure detection (membership): agents declared dead are recovered.
	Gossip *membership.Config
	// LeaveGrace is how long an agent that left the cluster gracefully
	// (a restart) has to come back before its jobs are recovered, and how
	// long agents have to register with a coordinator that begins to
	// lead before it answers without them (rebuild.go).
	LeaveGrace time.Duration
	// Quorum, when set, replaces failure detection's answer to whether
	// this coordinator reaches a majority of the cluster; without a
	// majority, no node is declared dead from here.
	Quorum func() bool

	// Leading, when set, says whether this replica holds the leader
	// lease: only the leader serves (leader.go). Nil: always serving.
	Leading func() bool

	// Limits on what callers can make the coordinator hold (DESIGN
	// invariant 10), checked before anything changes; a request over
	// one is refused and names the limit's flag (limits.go).
	//
	// MaxWorldSize bounds the ranks of one job: a restore plan, a
	// listing or a check of a step walks every rank.
	MaxWorldSize uint32
	// MaxJobs bounds the jobs in the index.
	MaxJobs int
	// MaxStepsPerJob bounds the steps of one job the index holds,
	// partial, consistent and abandoned together.
	MaxStepsPerJob int
	// MaxCopiesPerShard bounds the copies of one rank's shard of one
	// step: in nodes' memory and on the tiers.
	MaxCopiesPerShard int

	// The audit log (audit.go) keeps at most AuditMaxEntries entries,
	// none older than AuditRetention; the oldest go first.
	AuditMaxEntries int
	AuditRetention  time.Duration

	// Enroll, when set, issues agents without a certificate their node's
	// own (Enroll); nil refuses every enrollment.
	Enroll *EnrollConfig

	// Faults, when set, fires the armed fault points of the coordinator
	// (faultinject); nil unless the daemon runs with --fault-injection.
	Faults *faultinject.Injector

	Clock  clock.Clock
	Logger *slog.Logger
	// Registry takes the coordinator's metrics, served on MetricsAddr;
	// nil gives each coordinator New makes a registry of its own.
	Registry prometheus.Registerer
}

// DefaultConfig returns a coordinator configuration for one cluster.
func DefaultConfig() Config {
	return Config{
		ListenAddr:      "127.0.0.1:7080",              // loopback until TLS or --insecure is chosen: a cluster sets --listen :7080 with its certificates
		MetricsAddr:     "127.0.0.1:9465",              // the agent's metrics port plus one, so both run on one host
		DataDir:         "/var/lib/rewind/coordinator", // state of a system daemon, kept across restarts (FHS)
		AgentTimeout:    2 * time.Minute,               // verifying a large shard reads every byte
		RecoveryRetries: 8,                             // about two minutes of tries: a node lost during a recovery is declared dead in seconds
		Policy:          tiers.DefaultPolicy(),         // see DefaultPolicy: NVMe often, PFS less, the object store on a clock
		Replicas:        1,                             // survives any one node; a second costs another shard of memory per rank
		LeaveGrace:      10 * time.Second,              // an agent restart takes about a second
		Clock:           clock.Real,                    // tests pass a fake one
		Logger:          slog.Default(),                // the daemon passes its own

		MaxWorldSize:      65536, // the largest runs have tens of thousands of ranks; a whole-job plan this size is some MiB, tens of ms
		MaxJobs:           10000, // far more than one cluster runs at once; a job costs the index little until it saves
		MaxStepsPerJob:    1024,  // memory holds 2-3 steps per rank, each tier its keep=: room for long keeps and steps on their way out
		MaxCopiesPerShard: 64,    // own memory, up to MaxReplicas peers, one per tier, and what a recovery adds before old copies go

		AuditMaxEntries: 100000,              // years of a large cluster's registrations, restores and deletions, or a flood of refused calls; about 300 bytes each, 30 MB
		AuditRetention:  90 * 24 * time.Hour, // a quarter: what incident reviews and access audits look back over
	}
}

// Validate reports what is wrong with the configuration; it changes
// nothing.
func (c Config) Validate() error {
	var errs []error
	if c.ListenAddr == "" {
		errs = append(errs, errors.New("listen address is empty"))
	} else if err := c.Transport.CheckAddr("listen on", c.ListenAddr); err != nil {
		errs = append(errs, err)
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data directory is empty"))
	}
	if c.RecoveryRetries < 0 {
		errs = append(errs, fmt.Errorf("recovery retries %d must not be negative", c.RecoveryRetries))
	}
	if c.AgentTimeout <= 0 {
		errs = append(errs, fmt.Errorf("agent timeout %v must be positive", c.AgentTimeout))
	}
	if c.MaxWorldSize < 1 || c.MaxJobs < 1 || c.MaxStepsPerJob < 1 || c.MaxCopiesPerShard < 1 {
		errs = append(errs, fmt.Errorf("limits must be positive: max world size %d, jobs %d, steps per job %d, copies per shard %d",
			c.MaxWorldSize, c.MaxJobs, c.MaxStepsPerJob, c.MaxCopiesPerShard))
	}
	if e := c.Enroll; e != nil && (e.CA == nil || e.NodeOf == nil || e.Validity <= 0) {
		errs = append(errs, fmt.Errorf("enrollment needs a CA, a token check and a positive validity (%v)", e.Validity))
	} else if e != nil && !c.Transport.TLS() {
		errs = append(errs, errors.New("enrollment needs TLS (--tls-dir): a certificate is never issued over plaintext"))
	}
	if c.AuditMaxEntries < 1 || c.AuditRetention <= 0 {
		errs = append(errs, fmt.Errorf("audit log bounds must be positive: %d entries, retention %v", c.AuditMaxEntries, c.AuditRetention))
	}
	if c.LeaveGrace < 0 {
		errs = append(errs, fmt.Errorf("leave grace %v must not be negative", c.LeaveGrace))
	}
	if c.Replicas < 0 || c.Replicas > MaxReplicas {
		errs = append(errs, fmt.Errorf("replicas %d out of range [0, %d]", c.Replicas, MaxReplicas))
	}
	if err := c.Policy.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Clock == nil || c.Logger == nil {
		errs = append(errs, errors.New("clock and logger must be set (DefaultConfig sets both)"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("coordinator: invalid config: %w", err)
	}
	return nil
}
