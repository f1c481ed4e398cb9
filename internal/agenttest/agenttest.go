// Package agenttest starts real agents for tests: in-process on a real Unix
// socket and real shared memory, or as a separate process.
package agenttest

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
)

// Running is an agent started by Start.
type Running struct {
	Agent  *agent.Agent
	Config agent.Config
	Addrs  agent.Addrs
	stop   context.CancelFunc
	done   chan error
}

// ShmDir returns a fresh directory on /dev/shm, removed when t ends.
func ShmDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "rewind-test-")
	if err != nil {
		t.Fatalf("agenttest: /dev/shm is needed for shared memory: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// Config returns an agent configuration rooted in fresh temporary
// directories, with no TCP or metrics listener.
func Config(t testing.TB) agent.Config {
	t.Helper()
	cfg := agent.DefaultConfig()
	cfg.Node = "test-node"
	cfg.ShmRoot = filepath.Join(ShmDir(t), "shm")
	// Socket paths are limited to 108 bytes: keep them short.
	sockDir, err := os.MkdirTemp("", "rw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	cfg.Socket = filepath.Join(sockDir, "a.sock")
	cfg.ListenAddr, cfg.MetricsAddr = "", ""
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return cfg
}

// Start runs an in-process agent with cfg until t ends.
func Start(t testing.TB, cfg agent.Config) *Running {
	t.Helper()
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatalf("agenttest: starting agent: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{Agent: a, Config: cfg, stop: cancel, done: make(chan error, 1)}
	ready := make(chan agent.Addrs, 1)
	go func() { r.done <- a.Run(ctx, func(ad agent.Addrs) { ready <- ad }) }()
	select {
	case r.Addrs = <-ready:
	case err := <-r.done:
		t.Fatalf("agenttest: agent stopped: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("agenttest: agent not ready after 10s")
	}
	t.Cleanup(r.Stop)
	return r
}

// Stop stops the agent and waits for it; it may be called more than once.
func (r *Running) Stop() {
	if r.stop == nil {
		return
	}
	r.stop()
	r.stop = nil
	<-r.done
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Logf("%s", p)
	return len(p), nil
}

// FreePort returns a loopback address with a port free at the time of the
// call.
func FreePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
