package testcluster

import (
	"context"
	"sync"
	"testing"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
)

// Coordinator is a coordinator started in the test's process by
// StartCoordinator.
type Coordinator struct {
	*coordinator.Coordinator
	Addr        string // its gRPC address
	MetricsAddr string // "" without a metrics listener
	stop        func()
}

// CoordinatorConfig returns a coordinator configuration listening on a
// loopback port of its choosing with the test coordinator's certificate
// (CoordinatorID), no metrics listener, its store in a fresh temporary
// directory, and its logs discarded.
func CoordinatorConfig(t testing.TB) coordinator.Config {
	t.Helper()
	cfg := coordinator.DefaultConfig()
	cfg.ListenAddr, cfg.MetricsAddr, cfg.DataDir = "127.0.0.1:0", "", t.TempDir()
	cfg.Logger = Discard()
	cfg.Transport = TLS(t, CoordinatorID)
	return cfg
}

// StartCoordinator runs a coordinator with cfg in the test's process until
// t ends (or Stop), and returns once it listens.
func StartCoordinator(t testing.TB, cfg coordinator.Config) *Coordinator {
	t.Helper()
	c, err := coordinator.New(cfg)
	if err != nil {
		t.Fatalf("testcluster: starting coordinator: %v", err)
	}
	addrs, stop := serve(t, "coordinator", func(ctx context.Context, ready func([2]string)) error {
		return c.Run(ctx, func(grpcAddr, metricsAddr string) { ready([2]string{grpcAddr, metricsAddr}) })
	})
	var closed sync.Once
	r := &Coordinator{Coordinator: c, Addr: addrs[0], MetricsAddr: addrs[1]}
	r.stop = func() { stop(); closed.Do(func() { c.Close() }) }
	t.Cleanup(r.stop)
	return r
}

// Stop stops the coordinator, waits for it and closes its store (another
// may open it then); it may be called more than once.
func (r *Coordinator) Stop() { r.stop() }

// DialCoordinator returns a client of the coordinator at addr with an
// operator's certificate (OperatorID), closed when t ends. It does not
// wait for the coordinator to answer.
func DialCoordinator(t testing.TB, addr string) coordpb.CoordinatorClient {
	t.Helper()
	return DialCoordinatorAs(t, addr, OperatorID)
}
