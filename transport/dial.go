package transport

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// NewClient returns a gRPC client of the server at target (host:port)
// that must be expect, as s says: mutual TLS, or plaintext where
// CheckAddr allows it. opts come after the transport's own.
func (s *Security) NewClient(target string, expect Expect, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if err := s.CheckAddr("dial", target); err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{s.dialCreds(expect)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("transport: %s: %w", target, err)
	}
	return conn, nil
}

func (s *Security) dialCreds(expect Expect) grpc.DialOption {
	if !s.TLS() {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(s.clientTLS(expect, protoH2)))
}

// NewUnixClient returns a gRPC client of the server on the Unix socket
// at path: a local process, with no TLS.
func NewUnixClient(path string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+path, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
}

// DialData opens a connection for the agents' peer data path to addr,
// which must be expect: TLS with the handshake done, or plaintext where
// CheckAddr allows it.
func (s *Security) DialData(ctx context.Context, addr string, expect Expect) (net.Conn, error) {
	if err := s.CheckAddr("dial", addr); err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil || !s.TLS() {
		return c, err
	}
	cfg := s.clientTLS(expect, ProtoData)
	cfg.ClientSessionCache = s.sessions // keyed by the server's address
	tc := tls.Client(c, cfg)
	hctx, cancel := context.WithTimeout(ctx, HandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("transport: TLS handshake with %s: %w", addr, err)
	}
	return tc, nil
}
