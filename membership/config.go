package membership

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/clock"
)

// Config configures one member. DefaultConfig's timings give the detection
// bound documented there; DetectionBound computes it for other settings.
type Config struct {
	// Name is unique in the cluster (an agent's node name; the
	// coordinator's pod or host name).
	Name string
	// BindAddr and BindPort are where the member listens, UDP and TCP on
	// the same port. BindPort 0 picks a free port (tests).
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort are what the others dial; empty and 0
	// take the bound address (or a private IP when bound to 0.0.0.0) and port.
	AdvertiseAddr string
	AdvertisePort int
	// Meta is what the others learn about this member.
	Meta Meta
	// Seeds are host:port addresses Join uses when given none.
	Seeds []string

	// Keys encrypt and authenticate gossip (keys.go): the first encrypts,
	// every one decrypts. None: gossip is plaintext and unauthenticated.
	Keys [][]byte
	// KeyFile, when set, is where Keys came from (ReadKeyFile): it is
	// read again when it changes, every KeyReloadInterval, so keys
	// rotate with no restart.
	KeyFile           string
	KeyReloadInterval time.Duration
	// Label names the cluster in every gossip message (memberlist's
	// label, authenticated with the keys): members with another label
	// ignore each other's messages.
	Label string

	// Failure detection (memberlist's knobs, see DefaultConfig).
	ProbeInterval           time.Duration
	ProbeTimeout            time.Duration
	IndirectChecks          int
	SuspicionMult           int
	SuspicionMaxTimeoutMult int
	AwarenessMaxMultiplier  int
	GossipInterval          time.Duration
	GossipNodes             int
	RetransmitMult          int
	GossipToTheDeadTime     time.Duration
	PushPullInterval        time.Duration
	TCPTimeout              time.Duration
	DeadNodeReclaimTime     time.Duration

	// StatePollInterval is how often memberlist's node table is read to
	// see suspicions (memberlist reports joins and deaths, not suspicions).
	StatePollInterval time.Duration
	// ReconnectInterval is how often dead members are joined again, which
	// is how the two sides of a healed partition find each other.
	ReconnectInterval time.Duration
	// EventQueueLimit bounds the events waiting for a reader of Events;
	// beyond it the oldest are dropped and an EventLost is delivered.
	EventQueueLimit int

	// Faults, when set, routes this member's traffic through a fault
	// network that tests cut and slow down. Nil in production.
	Faults *FaultNetwork
	// Injector, when set, fires gossip/send on everything this member
	// sends (faultinject): drop loses it, reset refuses a stream, sleep
	// delays it. The daemons set it with --fault-injection.
	Injector *faultinject.Injector

	Clock clock.Clock
	// Logger takes the member's log; nil means slog's default logger (an
	// agent or a coordinator gives a member whose Logger is nil its own).
	Logger *slog.Logger
	// Registry takes the member's metrics; nil gives each member New
	// starts a registry of its own.
	Registry prometheus.Registerer
}

// DefaultConfig returns a configuration tuned for fast detection on a LAN,
// starting from memberlist.DefaultLANConfig.
//
// Detection bound. With n members, a member that stops answering is
// declared dead after
//
//	W + ProbeInterval + SuspicionMaxTimeoutMult·SuspicionMult·max(1, log10 n)·ProbeInterval
//
// W is the wait until some live member probes it: each of the n-1 others
// probes one member per interval, round-robin over a shuffled list, so the
// chance that nobody probes it for m intervals is at most e^-m; W ≤ 3
// intervals (0.6 s) with probability at least 95%. The probe itself fails
// after one interval (0.2 s: direct ping, then indirect pings and a TCP
// ping until the interval ends). The suspicion timeout is memberlist's
// SuspicionMult·max(1, log10 n)·ProbeInterval = 0.6 s for n ≤ 10 when one
// other member independently confirms the suspicion (Lifeguard), and
// SuspicionMaxTimeoutMult times that, 1.2 s, when none does. So for up to
// 10 members a crashed member is declared dead within 0.6 + 0.2 + 1.2 =
// 2.0 s with probability 95%, and usually in about 1 s (the design note
// records what the tests saw). At 100 members the bound is 3.2 s; at 1000,
// 4.4 s (the suspicion timeout grows with log10 n).
//
// A member that is slow rather than dead is suspected first, never
// declared dead outright: the suspect message reaches it (piggybacked on
// the next probe, and by gossip), it refutes with a higher incarnation,
// and it stays alive if the refutation arrives within the suspicion
// timeout. Lifeguard's local health also slows the probes of a member
// that is itself missing acks, so a slow member does not get healthy ones
// declared dead.
func DefaultConfig() Config {
	return Config{
		BindAddr: "0.0.0.0",
		BindPort: 7946, // memberlist's customary port
		Meta:     Meta{Role: RoleAgent},
		Label:    "rewind", // one cluster's gossip stays apart from another's on the same network

		KeyReloadInterval: 10 * time.Second, // a rotation waits for every member anyway; reading a small file every 10 s costs nothing

		ProbeInterval:           200 * time.Millisecond, // LAN default 1 s; five ~100-byte UDP probes a second per member is nothing on a LAN
		ProbeTimeout:            100 * time.Millisecond, // LAN default 500 ms; LAN round trips are well under 1 ms, 100 ms forgives a busy member before indirect probes start
		IndirectChecks:          3,                      // three others also probe, so one lossy link does not get a member suspected
		SuspicionMult:           3,                      // LAN default 4; 3 intervals (0.6 s at n ≤ 10) once one other member confirms (Lifeguard's k = SuspicionMult-2 = 1)
		SuspicionMaxTimeoutMult: 2,                      // LAN default 6; a suspicion nobody confirms waits twice as long (1.2 s), room for a slow member to refute
		AwarenessMaxMultiplier:  8,                      // a member missing acks itself probes up to 8x slower instead of accusing others
		GossipInterval:          100 * time.Millisecond, // LAN default 200 ms; suspect, dead and refute messages spread in a few 100 ms rounds
		GossipNodes:             3,                      // as LAN default
		RetransmitMult:          4,                      // each message retransmitted 4·log10(n+1) times, as LAN default
		GossipToTheDeadTime:     15 * time.Second,       // LAN default 30 s; the dead still hear gossip this long, so a member cut off briefly learns it was declared dead and refutes
		PushPullInterval:        10 * time.Second,       // LAN default 30 s; full-state anti-entropy repairs what gossip missed
		TCPTimeout:              2 * time.Second,        // LAN default 10 s; bounds a push/pull and each join attempt to a member that is gone
		DeadNodeReclaimTime:     5 * time.Second,        // a member restarted with a new address may take its name back after 5 s dead

		StatePollInterval: 100 * time.Millisecond, // suspicions last at least 0.6 s; 100 ms sees them early at the cost of one in-process table copy
		ReconnectInterval: time.Second,            // after a partition heals, the sides find each other within about a second
		EventQueueLimit:   4096,                   // far more than any burst of joins and deaths; memory stays bounded if nobody reads
		Clock:             clock.Real,             // tests pass a fake one
	}
}

// Validate reports what is wrong with the configuration; it changes
// nothing.
func (c Config) Validate() error {
	var errs []error
	if c.Name == "" {
		errs = append(errs, errors.New("name is empty"))
	}
	if net.ParseIP(c.BindAddr) == nil {
		errs = append(errs, fmt.Errorf("bind address %q is not an IP address", c.BindAddr))
	}
	if c.AdvertiseAddr != "" && net.ParseIP(c.AdvertiseAddr) == nil {
		errs = append(errs, fmt.Errorf("advertise address %q is not an IP address", c.AdvertiseAddr))
	}
	if c.BindPort < 0 || c.BindPort > math.MaxUint16 {
		errs = append(errs, fmt.Errorf("bind port %d out of range", c.BindPort))
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > math.MaxUint16 {
		errs = append(errs, fmt.Errorf("advertise port %d out of range", c.AdvertisePort))
	}
	for i, k := range c.Keys {
		if err := memberlist.ValidateKey(k); err != nil {
			errs = append(errs, fmt.Errorf("gossip key %d: %w", i+1, err))
		}
	}
	if len(c.Label) > memberlist.LabelMaxSize {
		errs = append(errs, fmt.Errorf("label %q is over %d bytes", c.Label, memberlist.LabelMaxSize))
	}
	if c.KeyFile != "" && c.KeyReloadInterval <= 0 {
		errs = append(errs, fmt.Errorf("key reload interval %v must be positive", c.KeyReloadInterval))
	}
	if err := c.Meta.Validate(); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"probe interval", c.ProbeInterval}, {"probe timeout", c.ProbeTimeout},
		{"gossip interval", c.GossipInterval}, {"TCP timeout", c.TCPTimeout},
		{"push/pull interval", c.PushPullInterval}, {"state poll interval", c.StatePollInterval},
		{"reconnect interval", c.ReconnectInterval},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s %v must be positive", d.name, d.v))
		}
	}
	if c.ProbeTimeout >= c.ProbeInterval {
		errs = append(errs, fmt.Errorf("probe timeout %v must be shorter than the probe interval %v", c.ProbeTimeout, c.ProbeInterval))
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"suspicion multiplier", c.SuspicionMult}, {"suspicion max timeout multiplier", c.SuspicionMaxTimeoutMult},
		{"awareness max multiplier", c.AwarenessMaxMultiplier}, {"gossip nodes", c.GossipNodes},
		{"retransmit multiplier", c.RetransmitMult}, {"event queue limit", c.EventQueueLimit},
	} {
		if n.v < 1 {
			errs = append(errs, fmt.Errorf("%s %d must be at least 1", n.name, n.v))
		}
	}
	if c.IndirectChecks < 0 {
		errs = append(errs, fmt.Errorf("indirect checks %d must not be negative", c.IndirectChecks))
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("clock must be set (DefaultConfig sets it)"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("membership: invalid config: %w", err)
	}
	return nil
}

// SuspicionTimeout is how long a suspected member of a cluster of n has to
// refute before it is declared dead: min once the suspicion is confirmed
// by enough others (Lifeguard), max when nobody confirms it. It is the
// formula memberlist uses.
func (c Config) SuspicionTimeout(n int) (min, max time.Duration) {
	scale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	min = time.Duration(float64(c.SuspicionMult) * scale * float64(c.ProbeInterval))
	return min, time.Duration(c.SuspicionMaxTimeoutMult) * min
}

// FirstProbeIntervals is the number of probe intervals DetectionBound
// allows until some member first probes a dead one: missed with
// probability at most e^-3 (5%).
const FirstProbeIntervals = 3

// DetectionBound is the time within which a member of a cluster of n that
// crashed is declared dead, with probability at least 95% (see
// DefaultConfig): FirstProbeIntervals to be probed, one interval for the
// probe to fail, then the unconfirmed suspicion timeout.
func (c Config) DetectionBound(n int) time.Duration {
	_, max := c.SuspicionTimeout(n)
	return (FirstProbeIntervals+1)*c.ProbeInterval + max
}

// memberlistConfig maps the configuration onto memberlist's.
func (c *Config) memberlistConfig() *memberlist.Config {
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.Name
	mc.BindAddr = c.BindAddr
	mc.BindPort = c.BindPort
	mc.AdvertiseAddr = c.AdvertiseAddr
	mc.AdvertisePort = c.AdvertisePort
	mc.ProtocolVersion = memberlist.ProtocolVersionMax // every member runs this build
	mc.ProbeInterval = c.ProbeInterval
	mc.ProbeTimeout = c.ProbeTimeout
	mc.IndirectChecks = c.IndirectChecks
	mc.SuspicionMult = c.SuspicionMult
	mc.SuspicionMaxTimeoutMult = c.SuspicionMaxTimeoutMult
	mc.AwarenessMaxMultiplier = c.AwarenessMaxMultiplier
	mc.GossipInterval = c.GossipInterval
	mc.GossipNodes = c.GossipNodes
	mc.RetransmitMult = c.RetransmitMult
	mc.GossipToTheDeadTime = c.GossipToTheDeadTime
	mc.PushPullInterval = c.PushPullInterval
	mc.TCPTimeout = c.TCPTimeout
	mc.DeadNodeReclaimTime = c.DeadNodeReclaimTime
	// Reading the node table in-process (snapshot.go) needs the plain
	// stream format; messages are small on a LAN anyway.
	mc.EnableCompression = false
	mc.Label = c.Label
	return mc
}
