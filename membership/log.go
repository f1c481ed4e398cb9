package membership

import (
	"bytes"
	"context"
	"log"
	"log/slog"
)

// memberlistLogger routes memberlist's log lines ("[WARN] memberlist: ...")
// to slog at debug level, memberlist's own level kept as an attribute:
// what matters to an operator (joins, suspicions, deaths) this package
// logs itself.
func memberlistLogger(l *slog.Logger) *log.Logger {
	return log.New(slogWriter{l}, "", 0)
}

type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	if !w.l.Enabled(context.Background(), slog.LevelDebug) {
		return len(p), nil
	}
	line := bytes.TrimRight(p, "\n")
	// The in-process reads of the node table (snapshot.go) would log a
	// stream connection every poll.
	if bytes.Contains(line, []byte(snapshotAddr)) {
		return len(p), nil
	}
	level := "INFO"
	if len(line) > 0 && line[0] == '[' {
		if i := bytes.IndexByte(line, ']'); i > 0 {
			level = string(line[1:i])
			line = bytes.TrimLeft(line[i+1:], " ")
		}
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	w.l.Debug(string(line), "component", "memberlist", "memberlist_level", level)
	return len(p), nil
}
