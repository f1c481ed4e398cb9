// Package progress shows a long operator command's progress (bytes, rate,
// time left) on a terminal, redrawn in place on one line, and nothing
// when its writer is not a terminal, so that piped output stays plain.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/units"
)

// redrawEvery bounds how often the line is redrawn: often enough to look
// live, rarely enough that a fast loop does not flood the terminal.
const redrawEvery = 100 * time.Millisecond

// Printer is the progress of one operation: items (steps, copies) and
// bytes done of a known total. Its methods may be called concurrently
// (a ticker beside the operation's loop).
type Printer struct {
	w     io.Writer
	clk   clock.Clock
	live  bool
	label string

	mu                sync.Mutex
	start, drawn      time.Time
	items, itemsTotal int
	bytes, bytesTotal uint64
	shown             bool // a line is on the terminal
}

// New returns a printer of an operation named label, of itemsTotal items
// and bytesTotal bytes (0: unknown), that writes to w when live.
func New(w io.Writer, clk clock.Clock, live bool, label string, itemsTotal int, bytesTotal uint64) *Printer {
	return &Printer{w: w, clk: clk, live: live, label: label, start: clk.Now(), itemsTotal: itemsTotal, bytesTotal: bytesTotal}
}

// Stderr returns a printer on standard error, live when it is a terminal.
func Stderr(label string, itemsTotal int, bytesTotal uint64) *Printer {
	return New(os.Stderr, clock.Real, IsTerminal(os.Stderr), label, itemsTotal, bytesTotal)
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// Add counts items and bytes done, and redraws.
func (p *Printer) Add(items int, bytes uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.items += items
	p.bytes += bytes
	p.drawLocked(p.items == p.itemsTotal)
}

// Set replaces what is done, and the totals, by values read from
// elsewhere (a transfer's bytes as its holder reports them); it redraws.
func (p *Printer) Set(items, itemsTotal int, bytes, bytesTotal uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.items, p.itemsTotal, p.bytes, p.bytesTotal = items, itemsTotal, bytes, bytesTotal
	p.drawLocked(false)
}

// Tick redraws (the elapsed time moves on while an item takes long).
func (p *Printer) Tick() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drawLocked(false)
}

// Clear takes the line off the terminal, before the command prints a
// result; the next Add or Tick draws it again.
func (p *Printer) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.shown = false
	}
}

// Above runs f, which prints the command's output, with the line taken
// off the terminal, so that no redraw lands in the middle of it; the
// next Add or Tick draws the line again, below.
func (p *Printer) Above(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.shown = false
	}
	f()
}

// Ticking redraws every period until the returned stop is called, which
// clears the line; when the printer is not live it starts nothing.
func (p *Printer) Ticking(period time.Duration) (stop func()) {
	if !p.live {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				p.Tick()
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done); <-exited; p.Clear() })
	}
}

// drawLocked redraws the line if live and the last draw is old enough
// (or force).
func (p *Printer) drawLocked(force bool) {
	if !p.live {
		return
	}
	now := p.clk.Now()
	if !force && p.shown && now.Sub(p.drawn) < redrawEvery {
		return
	}
	p.drawn, p.shown = now, true
	fmt.Fprint(p.w, "\r\x1b[K"+p.lineLocked(now))
}

// Line returns the progress line as it stands now.
func (p *Printer) Line() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lineLocked(p.clk.Now())
}

// lineLocked is "LABEL: 3/10 steps  1.2 GiB/4.0 GiB  300 MiB/s  9s left"
// (the parts known), elapsed time when nothing is done yet.
func (p *Printer) lineLocked(now time.Time) string {
	elapsed := now.Sub(p.start)
	var parts []string
	if p.itemsTotal > 0 {
		parts = append(parts, fmt.Sprintf("%d/%d", p.items, p.itemsTotal))
	}
	if p.bytesTotal > 0 {
		parts = append(parts, units.Bytes(p.bytes)+"/"+units.Bytes(p.bytesTotal))
	} else if p.bytes > 0 {
		parts = append(parts, units.Bytes(p.bytes))
	}
	if p.bytes > 0 && elapsed > 0 {
		rate := float64(p.bytes) / elapsed.Seconds()
		parts = append(parts, units.Bytes(uint64(rate))+"/s")
		if p.bytesTotal > p.bytes {
			left := time.Duration(float64(p.bytesTotal-p.bytes) / rate * float64(time.Second))
			parts = append(parts, roundDuration(left)+" left")
		}
	}
	parts = append(parts, roundDuration(elapsed)+" elapsed")
	return p.label + ": " + strings.Join(parts, "  ")
}

// roundDuration rounds d to what a person reads: whole seconds, tenths
// under ten seconds.
func roundDuration(d time.Duration) string {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
