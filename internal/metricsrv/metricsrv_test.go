package metricsrv

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/faultinject"
)

// get answers a GET of path on s: its status and body.
func get(t *testing.T, s *Server, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.Addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestGoroutinesOnlyWithFaultInjection: a daemon with fault injection on
// (a test cluster) serves its goroutines' stacks, for a chaos run to keep
// when a recovery hangs; one without serves no debug endpoint at all.
func TestGoroutinesOnlyWithFaultInjection(t *testing.T) {
	errc := make(chan error, 1)
	on, err := Start(Config{Addr: "127.0.0.1:0", Registry: prometheus.NewRegistry()}, errc, FaultRoutes(faultinject.New(slog.New(slog.DiscardHandler), 1))...)
	if err != nil {
		t.Fatal(err)
	}
	defer on.Close()
	code, body := get(t, on, GoroutinesPath)
	if code != http.StatusOK || !strings.Contains(body, "goroutine ") || !strings.Contains(body, "metricsrv.Start") {
		t.Fatalf("GET %s with fault injection on: %d, %.200q", GoroutinesPath, code, body)
	}
	off, err := Start(Config{Addr: "127.0.0.1:0", Registry: prometheus.NewRegistry()}, errc, FaultRoutes(nil)...)
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	for _, p := range []string{GoroutinesPath, faultinject.HandlerPath} {
		if code, _ := get(t, off, p); code != http.StatusNotFound {
			t.Fatalf("GET %s with fault injection off: %d, want 404", p, code)
		}
	}
	if code, _ := get(t, off, "/metrics"); code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", code)
	}
}
