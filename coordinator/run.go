package coordinator

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/metricsrv"
)

// staticWindow is the HTTP/2 flow-control window of the coordinator's
// connections, both ways (agents dial with the same).
const staticWindow = 1 << 20

// Run serves the coordinator's gRPC API (and metrics) until ctx ends.
// ready, when not nil, receives the gRPC and metrics addresses once open.
func (c *Coordinator) Run(ctx context.Context, ready func(grpcAddr, metricsAddr string)) error {
	l, err := c.cfg.Transport.Listen("coordinator", c.cfg.ListenAddr)
	if err != nil {
		return err
	}
	c.cfg.Transport.LogStart(c.log, "coordinator")
	srv := grpc.NewServer(append([]grpc.ServerOption{c.cfg.Transport.ServerOption(), grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		// Reports are small requests answered one by one. With dynamic
		// flow control every message received sends a BDP ping that the
		// peer answers: two more packets, and two more wake-ups on each
		// side, per report. A fixed window, larger than any report or
		// inventory needs in flight, has none.
		grpc.StaticStreamWindowSize(staticWindow), grpc.StaticConnWindowSize(staticWindow),
		// The audit first: it records what the authorizer refuses.
		grpc.ChainUnaryInterceptor(c.auditor.Unary, c.authz.Unary, c.unaryLeader),
		grpc.ChainStreamInterceptor(c.auditor.Stream, c.authz.Stream, c.streamLeader)},
		coordpb.KeepaliveServer()...)...)
	coordpb.RegisterCoordinatorServer(srv, &server{c: c})
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(l) }()
	var metrics *metricsrv.Server
	var metricsAddr string
	if c.cfg.MetricsAddr != "" {
		if metrics, err = metricsrv.Start(metricsrv.Config{Addr: c.cfg.MetricsAddr, Registry: c.cfg.Registry,
			Security: c.cfg.Transport, Authorizer: c.authz, Logger: c.log}, errc,
			append(metricsrv.FaultRoutes(c.cfg.Faults), c.readyz())...); err != nil {
			srv.Stop()
			return fmt.Errorf("coordinator: %w", err)
		}
		metricsAddr = metrics.Addr
	}
	go func() {
		t := time.NewTicker(flushEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.flush()
			}
		}
	}()
	go c.runTransfers(ctx)
	if c.cfg.Gossip != nil {
		leave, err := c.startMembership(ctx, l.Addr().String())
		if err != nil {
			srv.Stop()
			metrics.Close()
			return err
		}
		defer leave()
	}
	go c.finishUnfinished(ctx)
	c.log.Info("coordinator serving", "addr", l.Addr().String(), "metrics", metricsAddr)
	if ready != nil {
		ready(l.Addr().String(), metricsAddr)
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	srv.Stop()
	metrics.Close()
	return err
}
