// Package metricsrv serves a Prometheus registry over HTTP for the
// daemons, protected as their gRPC ports are (TLS, transport.Rules).
package metricsrv

import (
	"errors"
	"log/slog"
	"net/http"
	"runtime/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/transport"
)

// Server serves /metrics until Close.
type Server struct {
	// Addr is where it listens.
	Addr string
	srv  *http.Server
}

// Route is a handler served beside /metrics: a debug endpoint, or the
// coordinator's readiness. Method is the name transport.Rules authorizes
// it by (transport.HTTPDebug, transport.HTTPReady).
type Route struct {
	Path    string
	Method  string
	Handler http.Handler
}

// Config says where and how a daemon serves its metrics.
type Config struct {
	Addr string
	// Registry's metrics are served at /metrics; one that is not a
	// Gatherer serves the default registry.
	Registry prometheus.Registerer
	// Security protects the listener as it does the daemon's gRPC port:
	// TLS with the daemon's certificate (nil: plaintext, on loopback
	// only unless insecure).
	Security *transport.Security
	// Authorizer decides who may call each path (transport.Rules: readers
	// for /metrics); nil: one of the Security's own that counts nothing.
	Authorizer *transport.Authorizer
	Logger     *slog.Logger
}

// Start listens on cfg.Addr and serves the metrics at /metrics, and
// routes; a failure of the server after it started is sent to errc.
func Start(cfg Config, errc chan<- error, routes ...Route) (*Server, error) {
	authz := cfg.Authorizer
	if authz == nil {
		log := cfg.Logger
		if log == nil {
			log = slog.Default()
		}
		var err error
		if authz, err = transport.NewAuthorizer(cfg.Security, log, nil); err != nil {
			return nil, err
		}
	}
	l, err := cfg.Security.ListenHTTP("metrics", cfg.Addr)
	if err != nil {
		return nil, err
	}
	gatherer, _ := cfg.Registry.(prometheus.Gatherer)
	if gatherer == nil {
		gatherer = prometheus.DefaultGatherer
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", authz.HTTP(transport.HTTPMetrics, promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{})))
	for _, r := range routes {
		mux.Handle(r.Path, authz.HTTP(r.Method, r.Handler))
	}
	// Bounds on what a caller can hold: any TLS caller may ask /readyz,
	// so an idle connection is closed after a minute, a slow one after
	// its header's 10 s (the handshake included) or its answer's 30 s.
	s := &Server{Addr: l.Addr().String(), srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, ConnContext: transport.ConnContext}}
	go func() {
		if err := s.srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	return s, nil
}

// Close stops the server; a nil Server is a no-op.
func (s *Server) Close() {
	if s != nil {
		_ = s.srv.Close()
	}
}

// GoroutinesPath serves a dump of every goroutine's stack (as a Go
// program prints on SIGQUIT, without exiting) where fault injection is
// on: what a chaos run keeps when a recovery hangs.
const GoroutinesPath = "/debug/goroutines"

// FaultRoutes serves the fault injector's admin endpoint
// (faultinject.HandlerPath) and GoroutinesPath when fault injection is
// on (a test cluster); none otherwise.
func FaultRoutes(in *faultinject.Injector) []Route {
	if in == nil {
		return nil
	}
	return []Route{
		{Path: faultinject.HandlerPath, Method: transport.HTTPDebug, Handler: in.Handler()},
		{Path: GoroutinesPath, Method: transport.HTTPDebug, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_ = pprof.Lookup("goroutine").WriteTo(w, 2)
		})},
	}
}
