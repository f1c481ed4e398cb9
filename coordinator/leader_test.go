package coordinator_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/transport"
)

// TestOnlyTheLeaderServes: a replica that does not hold the leader lease
// answers every call Unavailable and is not ready (the Service leaves it
// out); once it leads it is ready, and serves. Its index knows no node
// whose agent to wait for, so answers about jobs wait for the agents'
// registrations a LeaveGrace (at least a second; rebuild.go), then come.
// Its readiness answers a probe over TLS that sends no certificate, as a
// kubelet's HTTPS probe does.
func TestOnlyTheLeaderServes(t *testing.T) {
	var leading atomic.Bool
	cfg := coordinator.DefaultConfig()
	cfg.ListenAddr, cfg.MetricsAddr, cfg.DataDir = "127.0.0.1:0", "127.0.0.1:0", t.TempDir()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Leading, cfg.LeaveGrace = leading.Load, time.Second
	cfg.Transport = testcluster.TLS(t, testcluster.CoordinatorID)
	c, err := coordinator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]string, 1)
	done := make(chan struct{})
	go func() { c.Run(ctx, func(g, m string) { addrs <- [2]string{g, m} }); close(done) }()
	t.Cleanup(func() { cancel(); <-done; c.Close() })
	a := <-addrs
	conn, err := testcluster.TLS(t, testcluster.OperatorID).NewClient(a[0], transport.ExpectCoordinator)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := coordpb.NewCoordinatorClient(conn)
	ready := func() int {
		// A kubelet's probe: no certificate, the server's not checked.
		probe := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}}
		resp, err := probe.Get(cfg.Transport.URL(a[1], "/readyz"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	_, err = api.ListJobs(ctxT(t), &coordpb.ListJobsRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "not the leader") {
		t.Fatalf("a follower answered ListJobs with %v", err)
	}
	stream, err := api.WatchJob(ctxT(t), &coordpb.WatchJobRequest{Job: "j"})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a follower's WatchJob: %v", err)
	}
	if code := ready(); code != http.StatusServiceUnavailable {
		t.Fatalf("a follower's /readyz: %d", code)
	}
	leading.Store(true)
	if code := ready(); code != http.StatusOK {
		t.Fatalf("the leader's /readyz: %d", code)
	}
	_, err = api.ListJobs(ctxT(t), &coordpb.ListJobsRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "rebuilding") {
		t.Fatalf("a new leader answered ListJobs before the agents could register: %v", err)
	}
	wait.ForNil(t, 10*time.Second, "the new leader to answer ListJobs", func() error {
		_, err := api.ListJobs(ctxT(t), &coordpb.ListJobsRequest{})
		return err
	})
}
