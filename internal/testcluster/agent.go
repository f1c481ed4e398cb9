// Package testcluster starts the parts of a rewind cluster for tests:
// agents and coordinators in the test's process, on real Unix sockets,
// loopback TCP and real shared memory; the same as processes of the test
// binary itself (re-executed in a role, see Main), so that a test can
// SIGKILL them; and the rewind binary, built once per test binary. Around
// them: SDK and coordinator clients closed when the test ends, and free
// loopback ports.
//
// A test package that starts processes has a TestMain that calls Main.
package testcluster

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/internal/freeport"
	"rewind.dev/rewind/sdk"
)

// Agent is an agent started in the test's process by StartAgent.
type Agent struct {
	Agent  *agent.Agent
	Config agent.Config
	Addrs  agent.Addrs
	stop   func()
}

// ShmDir returns a fresh directory on /dev/shm, removed when t ends.
func ShmDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "rewind-test-")
	if err != nil {
		t.Fatalf("testcluster: /dev/shm is needed for shared memory: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// AgentConfig returns an agent configuration rooted in fresh temporary
// directories, with no TCP or metrics listener, logging into the test's
// log, and the test nodes' shared certificate (NodeID) for the TCP
// listener and dials a test may turn on.
func AgentConfig(t testing.TB) agent.Config {
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
	cfg.Transport = TLS(t, NodeID)
	return cfg
}

// StartAgent runs an agent with cfg in the test's process until t ends
// (or Stop), and returns once it serves.
func StartAgent(t testing.TB, cfg agent.Config) *Agent {
	t.Helper()
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatalf("testcluster: starting agent: %v", err)
	}
	r := &Agent{Agent: a, Config: cfg}
	r.Addrs, r.stop = serve(t, "agent", a.Run)
	return r
}

// Stop stops the agent and waits for it; it may be called more than once.
func (r *Agent) Stop() { r.stop() }

// serve runs a daemon's Run in the test's process until t ends or stop is
// called (stop waits for Run to return, and may be called more than
// once), and returns the addresses Run reported ready with.
func serve[A any](t testing.TB, what string, run func(ctx context.Context, ready func(A)) error) (addrs A, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan A, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, func(a A) { ready <- a }) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	select {
	case addrs = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("testcluster: %s stopped: %v", what, err)
	case <-time.After(10 * time.Second):
		stop()
		t.Fatalf("testcluster: %s not ready after 10s", what)
	}
	t.Cleanup(stop)
	return addrs, stop
}

// Dial returns a client of the agent's SDK socket, closed when t ends.
func (r *Agent) Dial(t testing.TB, opts ...sdk.Options) *sdk.Client {
	t.Helper()
	return Dial(t, r.Config.Socket, opts...)
}

// Dial returns a client of the agent listening on socket, closed when t
// ends; it fails t if none answers.
func Dial(t testing.TB, socket string, opts ...sdk.Options) *sdk.Client {
	t.Helper()
	c, err := sdk.Dial(context.Background(), socket, opts...)
	if err != nil {
		t.Fatalf("testcluster: dial agent on %s: %v", socket, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Discard is a logger that writes nothing, for daemons whose logs would
// drown the test's own.
func Discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Logf("%s", p)
	return len(p), nil
}

// FreeAddr returns a loopback address with a port free at the time of the
// call (see package freeport for the race this leaves).
func FreeAddr(t testing.TB) string {
	t.Helper()
	a, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Flip inverts the lowest bit of the byte at off in the file at path (off
// < 0 counts from the end): bit rot in a shard, for a test of what notices
// it.
func Flip(t testing.TB, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if off < 0 {
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		off += st.Size()
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x01
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
