package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// HandshakeTimeout bounds a TLS handshake, both ways: a client that
// opens a connection and sends nothing holds a listener's goroutine this
// long at most, and a data-path dial to a frozen peer (its kernel still
// accepts the connection, and then nothing answers) fails after it,
// whatever its caller's context (a replica copy's has no end).
var HandshakeTimeout = 10 * time.Second

// Listen listens on addr (TCP) as s says: TLS, or plaintext where
// CheckAddr allows it. what names the listener in the refusal
// ("coordinator", "agent").
func (s *Security) Listen(what, addr string) (net.Listener, error) {
	return s.listen(what, addr, protoH2, ProtoData)
}

// listen is Listen offering protos to TLS clients (ALPN).
func (s *Security) listen(what, addr string, protos ...string) (net.Listener, error) {
	if err := s.CheckAddr("listen on", addr); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen %s: %w", what, addr, err)
	}
	if !s.TLS() {
		return l, nil
	}
	return &listener{Listener: l, s: s, cfg: s.serverTLS(protos...)}, nil
}

// listener accepts TLS connections; the handshake runs on the
// connection's first read (or its Peer), in the goroutine that serves it,
// never in Accept.
type listener struct {
	net.Listener
	s   *Security
	cfg *tls.Config
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &serverConn{Conn: tls.Server(c, l.cfg), s: l.s}, nil
}

// serverConn is a TLS connection a listener accepted.
type serverConn struct {
	*tls.Conn
	s    *Security
	once sync.Once
	peer Peer
}

// Peer completes the handshake if it has not run yet and verifies the
// client's certificate (once per connection).
func (c *serverConn) Peer() Peer {
	c.once.Do(func() {
		c.peer.Kind = PeerTLS
		ctx, cancel := context.WithTimeout(context.Background(), HandshakeTimeout)
		defer cancel()
		if err := c.Conn.HandshakeContext(ctx); err != nil {
			c.peer.Err = fmt.Errorf("TLS handshake: %w", err)
			return
		}
		cs := c.Conn.ConnectionState()
		c.peer.State = &cs
		c.peer.Identity, c.peer.Err = c.s.files.current().verify(cs.PeerCertificates, x509.ExtKeyUsageClientAuth, c.s.trustDomain, c.s.now())
	})
	return c.peer
}

// PeerKind is how a connection reached a server.
type PeerKind uint8

const (
	// PeerPlain is plaintext TCP (or a connection of a kind this package
	// does not know): trusted only by a server without TLS.
	PeerPlain PeerKind = iota
	// PeerLocal is a Unix socket: a process on this machine that could
	// open it.
	PeerLocal
	// PeerTLS is TLS: Identity is who the client's certificate names,
	// unless Err says why there is none.
	PeerTLS
)

// Peer is who is at the other end of a server's connection.
type Peer struct {
	Kind     PeerKind
	Identity Identity
	// Err, for PeerTLS, says why the client has no identity: no
	// certificate, one that is not trusted or expired, a failed
	// handshake.
	Err   error
	State *tls.ConnectionState
	// Cred, for PeerLocal, is the connecting process (SO_PEERCRED).
	Cred *Cred
}

// PeerOf returns who is at the other end of conn, a connection a server
// accepted (from a Listener of this package or a Unix socket), looking
// through wrappers that have a NetConn method. For a TLS connection it
// completes the handshake first.
func PeerOf(conn net.Conn) Peer {
	for conn != nil {
		switch c := conn.(type) {
		case *serverConn:
			return c.Peer()
		case *net.UnixConn:
			return Peer{Kind: PeerLocal, Cred: UnixCred(c)}
		case *net.TCPConn:
			return Peer{Kind: PeerPlain}
		case interface{ NetConn() net.Conn }:
			conn = c.NetConn()
		default:
			return Peer{Kind: PeerPlain}
		}
	}
	return Peer{Kind: PeerPlain}
}

// ServerOption is the gRPC server option of a server whose listeners come
// from Listen (or are Unix sockets): it makes each connection's Peer
// the gRPC peer's AuthInfo, where the interceptors of Authorizer find it.
func (s *Security) ServerOption() grpc.ServerOption {
	return grpc.Creds(serverCreds{s: s})
}

// AuthInfo is the gRPC AuthInfo of a connection to a server of this
// package.
type AuthInfo struct {
	credentials.CommonAuthInfo
	Peer Peer
}

// AuthType names the connection's kind.
func (a AuthInfo) AuthType() string {
	switch a.Peer.Kind {
	case PeerTLS:
		return "tls"
	case PeerLocal:
		return "local"
	}
	return "insecure"
}

// serverCreds are gRPC transport credentials that do no handshake of
// their own: the listener did it (or the connection needs none).
type serverCreds struct{ s *Security }

func (c serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	p := PeerOf(raw)
	if p.Kind == PeerTLS && p.State == nil { // not even a TLS client: nothing to answer
		return nil, nil, p.Err
	}
	level := credentials.NoSecurity
	if p.Kind == PeerTLS {
		level = credentials.PrivacyAndIntegrity
	}
	return raw, AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: level}, Peer: p}, nil
}

func (serverCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("transport: server credentials used to dial")
}

func (c serverCreds) Info() credentials.ProtocolInfo {
	if c.s.TLS() {
		return credentials.ProtocolInfo{SecurityProtocol: "tls"}
	}
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (c serverCreds) Clone() credentials.TransportCredentials { return c }

func (serverCreds) OverrideServerName(string) error { return nil }
