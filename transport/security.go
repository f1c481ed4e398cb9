package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config says how a daemon or client protects its TCP connections.
type Config struct {
	// Dir holds tls.crt, tls.key and ca.crt (CertFile, KeyFile, CAFile);
	// empty: plaintext.
	Dir string
	// Insecure allows plaintext beyond loopback; it cannot be combined
	// with Dir.
	Insecure bool
	// TrustDomain is the host of the SPIFFE IDs that name identities;
	// empty: DefaultTrustDomain.
	TrustDomain string
	// Logger takes reloads and unusable files; nil: slog.Default().
	Logger *slog.Logger
}

// Security is how a process protects its TCP connections: TLS 1.3 with
// mutual authentication from a certificate directory, or plaintext. A
// nil *Security is plaintext on loopback only, so a configuration that
// sets nothing is safe; every method accepts a nil receiver.
type Security struct {
	files       *files // nil: plaintext
	insecure    bool
	trustDomain string
	reloads     atomic.Uint64
	now         func() time.Time
	// sessions lets the peer data path, a connection per shard copied,
	// resume a TLS session with a server it already met: no certificate
	// is sent or signed again; the server's chain is still checked, and
	// the server still checks the client's, as the certificates stand now.
	sessions tls.ClientSessionCache
}

// New returns the security cfg asks for: nil (plaintext on loopback)
// when it names neither a directory nor Insecure, plaintext anywhere
// with Insecure, or TLS from Dir, whose files must be readable and
// valid now.
func New(cfg Config) (*Security, error) {
	if cfg.Dir != "" && cfg.Insecure {
		return nil, errors.New("transport: a certificate directory and insecure plaintext together: choose one")
	}
	if cfg.Dir == "" && !cfg.Insecure {
		return nil, nil
	}
	s := &Security{insecure: cfg.Insecure, trustDomain: cfg.TrustDomain, now: time.Now}
	if s.trustDomain == "" {
		s.trustDomain = DefaultTrustDomain
	}
	if cfg.Dir == "" {
		return s, nil
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	f, err := loadFiles(cfg.Dir, s.trustDomain, log, func() { s.reloads.Add(1) })
	if err != nil {
		return nil, err
	}
	s.files, s.sessions = f, tls.NewLRUClientSessionCache(256)
	return s, nil
}

// Load is New with TLS from dir.
func Load(dir string, log *slog.Logger) (*Security, error) {
	if dir == "" {
		return nil, errors.New("transport: no certificate directory")
	}
	return New(Config{Dir: dir, Logger: log})
}

// Insecure is plaintext on any address: for a network that something
// else protects, or none.
func Insecure() *Security {
	return &Security{insecure: true, trustDomain: DefaultTrustDomain, now: time.Now}
}

// TLS reports whether connections use TLS.
func (s *Security) TLS() bool { return s != nil && s.files != nil }

// IsInsecure reports whether plaintext is allowed beyond loopback.
func (s *Security) IsInsecure() bool { return s != nil && s.insecure }

// Identity is the identity the process's own certificate names (the
// zero Identity without TLS).
func (s *Security) Identity() Identity {
	if !s.TLS() {
		return Identity{}
	}
	return s.files.current().id
}

// NotAfter is when the process's own certificate expires (zero without
// TLS).
func (s *Security) NotAfter() time.Time {
	if !s.TLS() {
		return time.Time{}
	}
	return s.files.current().leaf.NotAfter
}

// String says what s does, for the log line a daemon writes as it starts.
func (s *Security) String() string {
	switch {
	case s.TLS():
		m := s.files.current()
		return fmt.Sprintf("mutual TLS 1.3 as %s (certificates in %s, expiring %s)", m.id, s.files.dir, m.leaf.NotAfter.UTC().Format(time.RFC3339))
	case s.IsInsecure():
		return "PLAINTEXT on every address (--insecure): anyone who reaches the port can read and change checkpoints"
	default:
		return "plaintext, on loopback addresses only"
	}
}

// LogStart logs how what (a daemon) protects its connections: loudly, at
// error level, when it runs insecure.
func (s *Security) LogStart(log *slog.Logger, what string) {
	if s.IsInsecure() {
		log.Error(what+" runs WITHOUT TLS (--insecure): every TCP connection is plaintext and unauthenticated; "+
			"anyone who reaches its ports can read, change and delete checkpoints", "transport", s.String())
		return
	}
	log.Info(what+" transport security", "transport", s.String())
}

// NextProtos: gRPC's HTTP/2, the agents' peer data path, and the
// metrics address's HTTP/1.1.
const (
	protoH2     = "h2"
	ProtoData   = "rewind-peer-data/1"
	protoHTTP11 = "http/1.1"
)

// serverTLS is the listener's TLS configuration. A client certificate is
// asked for but not required, nor verified, by the handshake: it is
// verified right after (peerOf), so that a client with none, or with one
// that is not trusted, is answered with an Unauthenticated status that
// names the method it called, instead of a broken handshake. A
// connection without a verified certificate reaches no handler and no
// data (authz.go).
func (s *Security) serverTLS(protos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.files.current().cert, nil
		},
		ClientAuth: tls.RequestClientCert,
		NextProtos: protos,
	}
}

// clientTLS is a dialer's TLS configuration: its own certificate, and the
// server's chain checked against the current authorities and its
// identity against expect. The host name is not checked: an identity is
// what a rewind certificate names, not an address (SPIFFE's rule), so
// that agents can be dialed by IP or by a name no certificate lists.
func (s *Security) clientTLS(expect Expect, protos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return s.files.current().cert, nil
		},
		InsecureSkipVerify: true, // the chain and the identity are checked below, not the host name
		VerifyConnection: func(cs tls.ConnectionState) error {
			id, err := s.files.current().verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth, s.trustDomain, s.now())
			if err != nil {
				return fmt.Errorf("transport: server: %w", err)
			}
			return expect.check(id)
		},
		NextProtos: protos,
	}
}

// CheckAddr refuses plaintext on an address beyond loopback unless s is
// insecure: what names the use ("listen", "dial the coordinator").
func (s *Security) CheckAddr(what, addr string) error {
	if s.TLS() || s.IsInsecure() || IsLoopback(addr) {
		return nil
	}
	return fmt.Errorf("refusing to %s %s in plaintext: give a certificate directory (--tls-dir; rewind certs makes one) or, on a network protected otherwise, --insecure", what, addr)
}

// IsLoopback reports whether addr (host:port, or a gRPC target) names
// only this machine: a loopback IP, localhost, or a Unix socket. An
// empty host (every interface) is not loopback.
func IsLoopback(addr string) bool {
	if strings.HasPrefix(addr, "unix:") {
		return true
	}
	addr = strings.TrimPrefix(strings.TrimPrefix(addr, "dns:///"), "passthrough:///")
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// Register adds s's metrics to reg: whether the process runs insecure,
// when its certificate expires, and how often it was reloaded.
func (s *Security) Register(reg prometheus.Registerer) error {
	insecure := 0.0
	if s.IsInsecure() {
		insecure = 1
	}
	cs := []prometheus.Collector{
		prometheus.NewGauge(prometheus.GaugeOpts{Name: "rewind_transport_insecure",
			Help: "1 when the process runs with --insecure: plaintext TCP on any address, no authentication."}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rewind_transport_tls",
			Help: "1 when TCP connections use mutual TLS."}, func() float64 {
			if s.TLS() {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rewind_transport_cert_expiry_timestamp_seconds",
			Help: "When the process's own certificate expires (Unix time); 0 without TLS."}, func() float64 {
			if t := s.NotAfter(); !t.IsZero() {
				return float64(t.Unix())
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rewind_transport_cert_reloads_total",
			Help: "Times the certificate files changed on disk and were loaded again."}, func() float64 {
			if s == nil {
				return 0
			}
			return float64(s.reloads.Load())
		}),
	}
	cs[0].(prometheus.Gauge).Set(insecure)
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("transport: metrics: %w", err)
		}
	}
	return nil
}
