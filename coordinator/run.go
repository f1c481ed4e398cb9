package coordinator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"rewind.dev/rewind/api/coordpb"
)

// Run serves the coordinator's gRPC API (and metrics) until ctx ends.
// ready, when not nil, receives the gRPC and metrics addresses once open.
func (c *Coordinator) Run(ctx context.Context, ready func(grpcAddr, metricsAddr string)) error {
	l, err := net.Listen("tcp", c.cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("coordinator: listen %s: %w", c.cfg.ListenAddr, err)
	}
	srv := grpc.NewServer()
	coordpb.RegisterCoordinatorServer(srv, &server{c: c})
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(l) }()
	var metricsAddr string
	var httpSrv *http.Server
	if c.cfg.MetricsAddr != "" {
		ml, err := net.Listen("tcp", c.cfg.MetricsAddr)
		if err != nil {
			srv.Stop()
			return fmt.Errorf("coordinator: listen %s for metrics: %w", c.cfg.MetricsAddr, err)
		}
		metricsAddr = ml.Addr().String()
		gatherer, _ := c.cfg.Registry.(prometheus.Gatherer)
		if gatherer == nil {
			gatherer = prometheus.DefaultGatherer
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
		httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := httpSrv.Serve(ml); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	c.log.Info("coordinator serving", "addr", l.Addr().String(), "metrics", metricsAddr)
	if ready != nil {
		ready(l.Addr().String(), metricsAddr)
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	srv.Stop()
	if httpSrv != nil {
		_ = httpSrv.Close()
	}
	return err
}
