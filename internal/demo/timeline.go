package demo

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"time"
)

// timeline prints what happens, each line stamped with the seconds since
// the demo began and who it is about. Safe for concurrent use.
type timeline struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func newTimeline(w io.Writer) *timeline { return &timeline{w: w, start: time.Now()} }

// at prints a line stamped with the time when.
func (t *timeline) at(when time.Time, who, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, "%7.2fs  %-8s %s\n", when.Sub(t.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// log prints a line stamped now.
func (t *timeline) log(who, format string, args ...any) { t.at(time.Now(), who, format, args...) }

// plain prints a line without a stamp.
func (t *timeline) plain(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, format+"\n", args...)
}

// indent is the width of a stamp and a name, to align continuation lines.
const indent = "                   "

// lineBuf collects a process's output as stamped lines, as they arrive.
// Write never blocks, so a process is never held up by a slow reader.
type lineBuf struct {
	mu      sync.Mutex
	partial []byte
	lines   []stamped
	notify  chan struct{} // receives a value after a Write that completes a line
}

type stamped struct {
	at   time.Time
	text string
}

func newLineBuf() *lineBuf { return &lineBuf{notify: make(chan struct{}, 1)} }

func (b *lineBuf) Write(p []byte) (int, error) {
	now := time.Now()
	b.mu.Lock()
	b.partial = append(b.partial, p...)
	n := 0
	for {
		i := bytes.IndexByte(b.partial, '\n')
		if i < 0 {
			break
		}
		b.lines = append(b.lines, stamped{at: now, text: string(b.partial[:i])})
		b.partial = b.partial[i+1:]
		n++
	}
	b.mu.Unlock()
	if n > 0 {
		select {
		case b.notify <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// take removes and returns the first complete line, if there is one.
func (b *lineBuf) take() (stamped, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.lines) == 0 {
		return stamped{}, false
	}
	l := b.lines[0]
	b.lines = b.lines[1:]
	return l, true
}

// pending reports whether a complete line is waiting.
func (b *lineBuf) pending() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.lines) > 0
}

// prefixWriter prints every line written to it on the timeline.
type prefixWriter struct {
	tl  *timeline
	who string
	buf []byte
	mu  sync.Mutex
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.tl.log(w.who, "! %s", w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}
