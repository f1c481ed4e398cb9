package testcluster

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// Logs collects a daemon's log lines, for a test that waits for one (the
// event it stands for has no other outward sign) or reads them after. It
// is safe for concurrent use.
type Logs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Logger returns a logger writing into l at level and above.
func (l *Logs) Logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: level}))
}

func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything logged so far.
func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Has reports whether a line logged so far contains every one of parts.
func (l *Logs) Has(parts ...string) bool {
	for line := range strings.Lines(l.String()) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}
