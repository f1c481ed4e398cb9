package chaos

import (
	"bufio"
	"bytes"
	"slices"
	"strconv"
	"strings"
	"time"

	"rewind.dev/rewind/internal/demo"
)

// Line is one line a node container wrote on its standard output, as
// `docker logs --timestamps` gives it back:
//
//	2026-11-21T09:20:00.123456789Z [rank 1] step 13 compute 250.1 ms saved 4.0 MiB in 2.0 ms digest 77b0...
//	2026-11-21T09:20:00.200000000Z [node] started rank 1: pid 42, demo-train ...
type Line struct {
	At      time.Time
	Service string // the container's compose service (node1, ...)
	Rank    int    // the rank that wrote it; -1 for the supervisor's lines
	Text    string // the line after the prefix
	// Event is the trainer's report parsed; nil for other lines (the
	// supervisor's, a rank's stderr).
	Event *demo.Event
}

// ParseLogs parses a node container's `docker logs --timestamps` output.
// Lines without a timestamp or a known prefix are skipped.
func ParseLogs(service string, out []byte) []Line {
	var lines []Line
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if l, ok := parseLine(service, sc.Text()); ok {
			lines = append(lines, l)
		}
	}
	return lines
}

// linesSince returns the lines of a daemon's `docker logs --timestamps`
// output stamped at or after since that contain substr, without their
// stamp.
func linesSince(out []byte, since time.Time, substr string) []string {
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		ts, rest, _ := strings.Cut(l, " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err == nil && !at.Before(since) && strings.Contains(rest, substr) {
			lines = append(lines, rest)
		}
	}
	return lines
}

func parseLine(service, s string) (Line, bool) {
	ts, rest, ok := strings.Cut(s, " ")
	if !ok {
		return Line{}, false
	}
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return Line{}, false
	}
	l := Line{At: at, Service: service, Rank: -1}
	switch {
	case strings.HasPrefix(rest, "[node] "):
		l.Text = strings.TrimPrefix(rest, "[node] ")
		return l, true
	case strings.HasPrefix(rest, "[rank "):
		tag, text, ok := strings.Cut(strings.TrimPrefix(rest, "[rank "), "] ")
		if !ok {
			return Line{}, false
		}
		num, stream, _ := strings.Cut(tag, " ")
		r, err := strconv.ParseUint(num, 10, 32)
		if err != nil {
			return Line{}, false
		}
		l.Rank, l.Text = int(r), text
		if stream == "" {
			if e, err := demo.ParseEvent(text); err == nil {
				e.At = at
				l.Event = &e
			}
		}
		return l, true
	}
	return Line{}, false
}

// events returns the trainer events of lines, in time order (lines of
// different containers merged).
func events(lines []Line) []Line {
	var out []Line
	for _, l := range lines {
		if l.Event != nil {
			out = append(out, l)
		}
	}
	sortByTime(out)
	return out
}

func sortByTime(lines []Line) {
	// Stable, so lines of one container with equal stamps keep their order.
	slices.SortStableFunc(lines, func(a, b Line) int { return a.At.Compare(b.At) })
}
