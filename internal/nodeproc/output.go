package nodeproc

import (
	"bytes"
	"fmt"
	"io"
	"sync"
)

// output is the node's report: whole lines from many writers, never
// interleaved within a line.
type output struct {
	mu  sync.Mutex
	out io.Writer
}

// printf writes one supervisor line, "[node] ...".
func (o *output) printf(format string, args ...any) {
	o.line("[node] " + fmt.Sprintf(format, args...))
}

func (o *output) line(s string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = io.WriteString(o.out, s+"\n")
}

// prefixed returns a writer that writes every line given to it as one
// line of o, after prefix ("[rank 1] "). A last line without a newline
// waits for one (the trainer ends every line with one).
func (o *output) prefixed(prefix string) io.Writer {
	return &lineWriter{o: o, prefix: prefix}
}

type lineWriter struct {
	o      *output
	prefix string
	mu     sync.Mutex
	buf    []byte
}

// maxLine bounds a line kept while waiting for its end: a process that
// writes without newlines has its output cut into lines of this size.
const maxLine = 64 << 10

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 && len(w.buf) >= maxLine {
			i = maxLine
		}
		if i < 0 {
			break
		}
		w.o.line(w.prefix + string(w.buf[:i]))
		if i < len(w.buf) && w.buf[i] == '\n' {
			i++
		}
		w.buf = w.buf[i:]
	}
	if len(w.buf) == 0 {
		w.buf = nil // let the array go
	}
	return len(p), nil
}
