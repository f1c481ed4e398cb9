// Package metricsrv serves a Prometheus registry over HTTP for the daemons.
package metricsrv

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"rewind.dev/rewind/faultinject"
)

// Server serves /metrics until Close.
type Server struct {
	// Addr is where it listens.
	Addr string
	srv  *http.Server
}

// Route is a handler served beside /metrics (a debug endpoint).
type Route struct {
	Path    string
	Handler http.Handler
}

// Start listens on addr and serves reg's metrics at /metrics, and routes;
// a failure of the server after it started is sent to errc. reg that is
// not a Gatherer serves the default registry.
func Start(addr string, reg prometheus.Registerer, errc chan<- error, routes ...Route) (*Server, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s for metrics: %w", addr, err)
	}
	gatherer, _ := reg.(prometheus.Gatherer)
	if gatherer == nil {
		gatherer = prometheus.DefaultGatherer
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	for _, r := range routes {
		mux.Handle(r.Path, r.Handler)
	}
	s := &Server{Addr: l.Addr().String(), srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
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
		{Path: faultinject.HandlerPath, Handler: in.Handler()},
		{Path: GoroutinesPath, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_ = pprof.Lookup("goroutine").WriteTo(w, 2)
		})},
	}
}
