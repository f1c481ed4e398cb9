package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/internal/clock"
)

type lineCase struct {
	items, itemsTotal int
	done, total       uint64
	after             time.Duration
	want              string
}

func TestLine(t *testing.T) {
	cases := map[string]lineCase{
		"nothing done yet": {itemsTotal: 4, total: 4 << 30, after: 2 * time.Second,
			want: "verifying: 0/4  0 B/4.0 GiB  2s elapsed"},
		"a quarter in 2s": {items: 1, itemsTotal: 4, done: 1 << 30, total: 4 << 30, after: 2 * time.Second,
			want: "verifying: 1/4  1.0 GiB/4.0 GiB  512.0 MiB/s  6s left  2s elapsed"},
		"all done": {items: 4, itemsTotal: 4, done: 4 << 30, total: 4 << 30, after: 80 * time.Second,
			want: "verifying: 4/4  4.0 GiB/4.0 GiB  51.2 MiB/s  1m20s elapsed"},
		"no total known": {after: 1500 * time.Millisecond,
			want: "verifying: 1.5s elapsed"},
		"bytes of no known total": {done: 3 << 20, after: 3 * time.Second,
			want: "verifying: 3.0 MiB  1.0 MiB/s  3s elapsed"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) { runLine(t, tc) })
	}
}

func runLine(t *testing.T, tc lineCase) {
	clk := clock.NewFake(time.Unix(100, 0))
	p := New(&bytes.Buffer{}, clk, false, "verifying", tc.itemsTotal, tc.total)
	p.Add(tc.items, tc.done)
	clk.Step(tc.after)
	if got := p.Line(); got != tc.want {
		t.Errorf("line %q, want %q", got, tc.want)
	}
}

// TestNotLiveWritesNothing: piped, the printer stays silent.
func TestNotLiveWritesNothing(t *testing.T) {
	var out bytes.Buffer
	clk := clock.NewFake(time.Unix(100, 0))
	p := New(&out, clk, false, "deleting", 2, 10)
	p.Add(1, 5)
	clk.Step(time.Second)
	p.Tick()
	p.Add(1, 5)
	p.Clear()
	p.Ticking(time.Millisecond)()
	if out.Len() != 0 {
		t.Fatalf("a printer that is not live wrote %q", out.String())
	}
}

// TestLiveRedrawsInPlace: on a terminal each draw rewrites the line,
// draws come at most every redrawEvery unless the work is done, and
// Clear takes the line away.
func TestLiveRedrawsInPlace(t *testing.T) {
	var out bytes.Buffer
	clk := clock.NewFake(time.Unix(100, 0))
	p := New(&out, clk, true, "deleting", 3, 30)
	p.Add(1, 10) // first draw
	p.Add(1, 10) // too soon: not drawn
	if n := strings.Count(out.String(), "\r\x1b[K"); n != 1 {
		t.Fatalf("%d draws after two quick adds, want 1: %q", n, out.String())
	}
	clk.Step(redrawEvery)
	p.Tick()
	p.Add(1, 10) // the last item: drawn at once
	draws := strings.Split(out.String(), "\r\x1b[K")[1:]
	if len(draws) != 3 || !strings.HasPrefix(draws[2], "deleting: 3/3  30 B/30 B") {
		t.Fatalf("draws %q", draws)
	}
	out.Reset()
	p.Clear()
	p.Clear()
	if out.String() != "\r\x1b[K" {
		t.Fatalf("clear wrote %q, want one erase", out.String())
	}
}

// TestSet: values read from elsewhere replace what was counted.
func TestSet(t *testing.T) {
	clk := clock.NewFake(time.Unix(100, 0))
	p := New(&bytes.Buffer{}, clk, false, "copying", 0, 0)
	p.Add(1, 10)
	clk.Step(4 * time.Second)
	p.Set(1, 3, 2<<20, 8<<20)
	if got, want := p.Line(), "copying: 1/3  2.0 MiB/8.0 MiB  512.0 KiB/s  12s left  4s elapsed"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
}
