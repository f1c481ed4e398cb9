package tiers

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"rewind.dev/rewind/internal/clock"
)

// fakeLimiter returns a limiter on a fake clock whose waits move the clock
// forward to the time waited for (never back), as if the waiter had slept
// exactly that long. It records the times waited for.
func fakeLimiter(rate int64) (*Limiter, *clock.Fake, func() []time.Time) {
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	l := NewLimiter(rate, fake)
	var mu sync.Mutex
	var waits []time.Time
	l.until = func(ctx context.Context, t time.Time) error {
		mu.Lock()
		defer mu.Unlock()
		waits = append(waits, t)
		if d := t.Sub(fake.Now()); d > 0 {
			fake.Step(d)
		}
		return ctx.Err()
	}
	return l, fake, func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(waits)
	}
}

// zeroReaderAt reads nothing and says it read everything, so the rate
// tests measure the limiter, not copying.
type zeroReaderAt struct{}

func (zeroReaderAt) ReadAt(p []byte, _ int64) (int, error) { return len(p), nil }

// passed is n bytes allowed through at a fake time.
type passed struct {
	at time.Time
	n  int64
}

// checkRate fails unless, at every moment, the bytes passed so far are at
// most a full bucket plus the rate times the time since start.
func checkRate(t *testing.T, l *Limiter, start time.Time, ps []passed) {
	t.Helper()
	slices.SortFunc(ps, func(a, b passed) int { return a.at.Compare(b.at) })
	var sum int64
	for _, p := range ps {
		sum += p.n
		allowed := float64(l.burst) + l.rate*p.at.Sub(start).Seconds()
		if float64(sum) > allowed+1 {
			t.Fatalf("%d bytes passed %v after the start; the limit allows %.0f", sum, p.at.Sub(start), allowed)
		}
	}
}

func TestLimiterRate(t *testing.T) {
	const rate = 100 << 20 // burst 10 MiB
	type tc struct {
		goroutines, reads, readSize int
	}
	run := func(t *testing.T, tc tc) {
		l, fake, _ := fakeLimiter(rate)
		start := fake.Now()
		r := LimitReaderAt(t.Context(), zeroReaderAt{}, l)
		var mu sync.Mutex
		var ps []passed
		var wg sync.WaitGroup
		for range tc.goroutines {
			wg.Go(func() {
				buf := make([]byte, tc.readSize)
				for range tc.reads {
					if n, err := r.ReadAt(buf, 0); err != nil || n != len(buf) {
						t.Errorf("ReadAt = %d, %v", n, err)
						return
					}
					mu.Lock()
					ps = append(ps, passed{fake.Now(), int64(len(buf))})
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		checkRate(t, l, start, ps)
		// The last byte may pass once the bucket has refilled for all but
		// the first bucketful, and should not be held back much longer.
		total := float64(tc.goroutines * tc.reads * tc.readSize)
		elapsed := fake.Now().Sub(start).Seconds()
		if least, most := (total-float64(l.burst))/rate, total/rate; elapsed < least-1e-6 || elapsed > most {
			t.Fatalf("%.0f bytes took %.3f s of fake time, want %.3f..%.3f s", total, elapsed, least, most)
		}
	}
	for name, c := range map[string]tc{
		"one reader, small reads":     {goroutines: 1, reads: 400, readSize: 1 << 20},
		"one reader, reads > burst":   {goroutines: 1, reads: 10, readSize: 64 << 20},
		"eight readers":               {goroutines: 8, reads: 100, readSize: 1 << 20},
		"eight readers, odd sizes":    {goroutines: 8, reads: 50, readSize: 3<<20 + 17},
		"sixteen readers, huge reads": {goroutines: 16, reads: 3, readSize: 25 << 20},
	} {
		t.Run(name, func(t *testing.T) { run(t, c) })
	}
}

// TestLimiterSplitsLargeWaits: a wait for many buckets waits a bucket at a
// time, so concurrent transfers interleave instead of one reserving
// seconds ahead.
func TestLimiterSplitsLargeWaits(t *testing.T) {
	l, fake, waits := fakeLimiter(10 << 20) // 1 MiB burst: 0.1 s per bucket
	start := fake.Now()
	if err := l.Wait(t.Context(), 10<<20); err != nil {
		t.Fatal(err)
	}
	ws := waits()
	if len(ws) != 9 { // the first bucketful passes at once
		t.Fatalf("10 buckets waited %d times, want 9", len(ws))
	}
	prev := start
	for i, w := range ws {
		if step := w.Sub(prev); step <= 0 || step > 100*time.Millisecond+time.Microsecond {
			t.Fatalf("wait %d is %v after the one before, want at most 100ms", i, step)
		}
		prev = w
	}
}

// TestLimiterRefills: an idle limiter refills to one bucket, not more.
func TestLimiterRefills(t *testing.T) {
	l, fake, waits := fakeLimiter(100 << 20)
	ctx := t.Context()
	if err := l.Wait(ctx, int(l.burst)); err != nil || len(waits()) != 0 {
		t.Fatalf("a full bucket waited: %v, %d waits", err, len(waits()))
	}
	fake.Step(time.Hour)
	if err := l.Wait(ctx, int(l.burst)); err != nil || len(waits()) != 0 {
		t.Fatalf("a refilled bucket waited: %v, %d waits", err, len(waits()))
	}
	before := fake.Now()
	if err := l.Wait(ctx, 1); err != nil || len(waits()) != 1 {
		t.Fatalf("an empty bucket did not wait: %v, %d waits", err, len(waits()))
	}
	if got := fake.Now().Sub(before); got <= 0 || got > time.Millisecond {
		t.Fatalf("one byte after an hour idle and two buckets waited %v", got)
	}
}

func TestLimiterUnlimited(t *testing.T) {
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	for name, l := range map[string]*Limiter{"nil": nil, "zero": NewLimiter(0, nil), "negative": NewLimiter(-5, nil)} {
		t.Run(name, func(t *testing.T) {
			if l.Rate() != 0 {
				t.Fatalf("Rate() = %d, want 0", l.Rate())
			}
			if err := l.Wait(cancelled, 1<<40); err != nil {
				t.Fatalf("Wait = %v, want nil at once", err)
			}
			src := bytes.NewReader([]byte("abc"))
			if r := LimitReaderAt(cancelled, src, l); r != src {
				t.Fatalf("LimitReaderAt wrapped the reader: %T", r)
			}
			var dst buffer
			if w := LimitWriterAt(cancelled, &dst, l); w != &dst {
				t.Fatalf("LimitWriterAt wrapped the writer: %T", w)
			}
		})
	}
	if got := NewLimiter(500e6, nil).Rate(); got != 500e6 {
		t.Fatalf("Rate() = %d, want 500e6", got)
	}
}

// TestLimiterCancel: a wait cancelled while sleeping returns the context's
// error and gives its bytes back; a read or write through a limiter whose
// context has ended moves nothing.
func TestLimiterCancel(t *testing.T) {
	l, fake, _ := fakeLimiter(10 << 20)
	ctx, cancel := context.WithCancel(t.Context())
	l.until = func(ctx context.Context, t time.Time) error {
		cancel()
		return l.sleepUntil(ctx, t) // real sleeping, for a time the fake clock never reaches
	}
	if err := l.Wait(ctx, int(l.burst)); err != nil {
		t.Fatal(err)
	}
	if err := l.Wait(ctx, 1<<20); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
	// The cancelled bytes went back: after a bucket's worth of time the
	// bucket is full again and a bucketful passes at once.
	fake.Step(100 * time.Millisecond)
	if at, wait := l.reserve(l.burst); wait {
		t.Fatalf("a cancelled wait kept its bytes: the next bucketful waits until %v", at.Sub(fake.Now()))
	}

	src := bytes.NewReader([]byte("abc"))
	buf := make([]byte, 3)
	if n, err := LimitReaderAt(ctx, src, l).ReadAt(buf, 0); n != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("ReadAt after cancel = %d, %v", n, err)
	}
	dst := buffer{b: make([]byte, 3)}
	if n, err := LimitWriterAt(ctx, &dst, l).WriteAt(buf, 0); n != 0 || !errors.Is(err, context.Canceled) || !bytes.Equal(dst.b, make([]byte, 3)) {
		t.Fatalf("WriteAt after cancel = %d, %v (wrote %q)", n, err, dst.b)
	}
}

// TestLimitWriterAt: writes pass through unchanged, at the rate.
func TestLimitWriterAt(t *testing.T) {
	l, fake, _ := fakeLimiter(10 << 20)
	start := fake.Now()
	want := data(5<<20+3, 7)
	dst := buffer{b: make([]byte, len(want))}
	w := LimitWriterAt(t.Context(), &dst, l)
	for off := 0; off < len(want); off += 1 << 20 {
		end := min(off+1<<20, len(want))
		if n, err := w.WriteAt(want[off:end], int64(off)); err != nil || n != end-off {
			t.Fatalf("WriteAt = %d, %v", n, err)
		}
	}
	if !bytes.Equal(dst.b, want) {
		t.Fatal("the limited writer changed the bytes")
	}
	if got, least := fake.Now().Sub(start), 400*time.Millisecond; got < least {
		t.Fatalf("5 MiB at 10 MiB/s with a 1 MiB bucket took %v of fake time, want at least %v", got, least)
	}
}
