package transport

import (
	"context"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The daemons' metrics address serves HTTP: Prometheus's /metrics, the
// coordinator's /readyz, and with fault injection on the debug
// endpoints. It is protected like the gRPC port: TLS with the daemon's
// certificate when it has one, and these names in Rules say who may
// call what.
const (
	// HTTPMetrics is GET /metrics: counters and gauges, no checkpoint
	// data, for readers (a Prometheus with a reader certificate).
	HTTPMetrics = "/rewind.http/Metrics"
	// HTTPReady is a readiness probe (/readyz): it tells nothing but
	// whether the daemon serves, and a kubelet's HTTPS probe sends no
	// certificate, so any TLS caller may ask.
	HTTPReady = "/rewind.http/Ready"
	// HTTPDebug is the fault injector's admin endpoint and the goroutine
	// dump (served only with fault injection on): operators only.
	HTTPDebug = "/rewind.http/Debug"
)

// ListenHTTP listens on addr for an HTTP server as Listen does, offering
// HTTP/1.1 to TLS clients. The server must set ConnContext to
// ConnContext for HTTP to find each request's peer.
func (s *Security) ListenHTTP(what, addr string) (net.Listener, error) {
	return s.listen(what, addr, protoHTTP11)
}

type connKey struct{}

// ConnContext is an http.Server's ConnContext that keeps each
// connection in its requests' context, where HTTP finds the peer.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// HTTP serves h to the callers Rules allow to call method (one of the
// HTTP names above); others get 401 (no verified certificate) or 403 (a
// role not allowed), with the reason, logged and counted as gRPC
// refusals are. A plaintext client of a TLS listener gets no answer:
// its connection fails the handshake.
func (a *Authorizer) HTTP(method string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := Peer{Kind: PeerPlain}
		if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
			p = PeerOf(c)
		}
		if err := a.Allow(p, method, nil); err != nil {
			code := http.StatusForbidden
			if status.Code(err) == codes.Unauthenticated {
				code = http.StatusUnauthorized
			}
			http.Error(w, status.Convert(err).Message(), code)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// HTTPClient is a client of daemons' metrics addresses that must be
// expect: mutual TLS with s's certificate, or plaintext without TLS
// (Dial refuses a plaintext address beyond loopback unless s is
// insecure). URL makes the addresses' URLs.
func (s *Security) HTTPClient(expect Expect) *http.Client {
	t := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if err := s.CheckAddr("dial", addr); err != nil {
				return nil, err
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		TLSHandshakeTimeout: HandshakeTimeout,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     time.Minute,
	}
	if s.TLS() {
		t.TLSClientConfig = s.clientTLS(expect, protoHTTP11)
	}
	return &http.Client{Transport: t}
}

// URL is the URL of path on the metrics address addr (host:port):
// https with TLS, http without.
func (s *Security) URL(addr, path string) string {
	if s.TLS() {
		return "https://" + addr + path
	}
	return "http://" + addr + path
}
