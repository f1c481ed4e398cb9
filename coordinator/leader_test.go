package coordinator_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/wait"
)

// TestOnlyTheLeaderServes: a replica that does not hold the leader lease
// answers every call Unavailable and is not ready (the Service leaves it
// out); once it leads it is ready, and serves. Its index knows no node
// whose agent to wait for, so answers about jobs wait for the agents'
// registrations a LeaveGrace (at least a second; rebuild.go), then come.
func TestOnlyTheLeaderServes(t *testing.T) {
	var leading atomic.Bool
	cfg := coordinator.DefaultConfig()
	cfg.ListenAddr, cfg.MetricsAddr, cfg.DataDir = "127.0.0.1:0", "127.0.0.1:0", t.TempDir()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Leading, cfg.LeaveGrace = leading.Load, time.Second
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
	conn, err := grpc.NewClient(a[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := coordpb.NewCoordinatorClient(conn)
	ready := func() int {
		resp, err := http.Get("http://" + a[1] + "/readyz")
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
