package chaos

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"rewind.dev/rewind/internal/units"
)

// Row is one scenario's line of the result table.
type Row struct {
	Scenario  string
	Detected  string // fault to detection
	Recovered string // fault (or healing) to the job recovered
	StepsLost string
	Bytes     string // restored state compared with the reference, and tier copies re-read
	History   string // the history checker's verdict: ok (ops checked) or FAIL
	Result    string // PASS, FAIL or SKIP
}

var tableHeader = Row{"scenario", "detected after", "recovered after", "steps lost", "bytes verified", "history", "result"}

func (r Row) cells() []string {
	return []string{r.Scenario, r.Detected, r.Recovered, r.StepsLost, r.Bytes, r.History, r.Result}
}

// WriteTable writes rows as a Markdown table, columns padded to align.
func WriteTable(w io.Writer, rows []Row) {
	all := append([]Row{tableHeader}, rows...)
	width := make([]int, len(tableHeader.cells()))
	for _, r := range all {
		for i, c := range r.cells() {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range cells {
			fmt.Fprintf(&b, " %s%s |", c, strings.Repeat(" ", width[i]-len([]rune(c))))
		}
		fmt.Fprintln(w, b.String())
	}
	line(tableHeader.cells())
	sep := make([]string, len(width))
	for i, n := range width {
		sep[i] = strings.Repeat("-", n)
	}
	line(sep)
	for _, r := range rows {
		line(r.cells())
	}
}

// ParseTable reads a table WriteTable wrote back into rows (the README
// quotes one; a test checks it still parses).
func ParseTable(text string) ([]Row, error) {
	var rows []Row
	for n, l := range strings.Split(strings.TrimSpace(text), "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "|") || !strings.HasSuffix(l, "|") {
			return nil, fmt.Errorf("chaos: table line %d: %q is not a table row", n+1, l)
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) != len(tableHeader.cells()) {
			return nil, fmt.Errorf("chaos: table line %d has %d cells, want %d", n+1, len(cells), len(tableHeader.cells()))
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		r := Row{cells[0], cells[1], cells[2], cells[3], cells[4], cells[5], cells[6]}
		if r == tableHeader || strings.Trim(cells[0], "-") == "" {
			continue
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// seconds formats durations as "1.2 s", up to three joined by " / ",
// more as their median and maximum ("median 0.8 s, max 3.5 s of 20").
func seconds(ds ...time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	if len(ds) > 3 {
		s := slices.Sorted(slices.Values(ds))
		f := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s" }
		return fmt.Sprintf("median %s, max %s of %d", f(s[len(s)/2]), f(s[len(s)-1]), len(s))
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	}
	return strings.Join(parts, " / ")
}

// counts formats step counts, several joined by " / ".
func counts(ns ...int64) string {
	if len(ns) == 0 {
		return "0"
	}
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = strconv.FormatInt(n, 10)
	}
	return strings.Join(parts, " / ")
}

func bytesCell(n uint64) string {
	if n == 0 {
		return "-"
	}
	return units.Bytes(n)
}
