package tiers

import (
	"context"
	"io"
	"sync"
	"time"

	"rewind.dev/rewind/internal/clock"
)

// Limiter caps the bytes per second that a node's tier transfers move, so
// that a transfer running beside training does not starve it of memory or
// disk bandwidth. It is a token bucket shared by all transfers of a node: a
// Wait takes its bytes from the bucket, or reserves them and sleeps until
// the bucket has refilled. A nil *Limiter, or one made with bytesPerSec <=
// 0, never waits.
//
// A Limiter is safe for concurrent use; waiters are served in the order in
// which they asked.
type Limiter struct {
	rate  float64 // bytes per second
	burst int64   // bytes the bucket holds when full; also the largest single reservation
	clk   clock.Clock
	// until sleeps until t on clk or ctx ends; tests replace it with one
	// that steps a fake clock.
	until func(ctx context.Context, t time.Time) error

	mu     sync.Mutex
	tokens float64   // bytes that may pass now; negative when reservations are outstanding
	last   time.Time // when tokens was brought up to date
}

// minBurst is the smallest bucket: below it a low rate would turn every
// chunk of a transfer into several waits.
const minBurst = 1 << 20

// NewLimiter returns a limiter of bytesPerSec, or nil (unlimited) when
// bytesPerSec <= 0. Its bucket holds a tenth of a second of the rate, at
// least 1 MiB: transfers never stall training for longer than 100 ms worth
// of bytes at once, yet a 1 MiB read costs one wait. The bucket starts
// full. clk decides how many bytes may pass; nil means the real clock.
func NewLimiter(bytesPerSec int64, clk clock.Clock) *Limiter {
	if bytesPerSec <= 0 {
		return nil
	}
	if clk == nil {
		clk = clock.Real
	}
	burst := max(bytesPerSec/10, minBurst)
	l := &Limiter{rate: float64(bytesPerSec), burst: burst, clk: clk, tokens: float64(burst), last: clk.Now()}
	l.until = l.sleepUntil
	return l
}

// Rate returns the limit in bytes per second; 0 means unlimited.
func (l *Limiter) Rate() int64 {
	if l == nil {
		return 0
	}
	return int64(l.rate)
}

// Wait blocks until n bytes may pass or ctx ends, and then returns
// ctx.Err(). A request larger than the bucket is served in bucket-sized
// pieces, so that concurrent transfers share the rate instead of one
// reserving seconds ahead. Bytes whose wait was cancelled go back to the
// bucket.
func (l *Limiter) Wait(ctx context.Context, n int) error {
	if l == nil || n <= 0 {
		return nil
	}
	for left := int64(n); left > 0; {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := min(left, l.burst)
		if at, wait := l.reserve(k); wait {
			if err := l.until(ctx, at); err != nil {
				l.refund(k)
				return err
			}
		}
		left -= k
	}
	return nil
}

// reserve takes k bytes from the bucket and returns when they may pass,
// and whether that is later than now.
func (l *Limiter) reserve(k int64) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.advance()
	l.tokens -= float64(k)
	if l.tokens >= 0 {
		return now, false
	}
	return now.Add(time.Duration(-l.tokens / l.rate * float64(time.Second))), true
}

// refund gives back k bytes a cancelled wait did not move.
func (l *Limiter) refund(k int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.advance()
	l.tokens = min(l.tokens+float64(k), float64(l.burst))
}

// advance adds the tokens earned since last and returns now. Called with
// mu held.
func (l *Limiter) advance() time.Time {
	now := l.clk.Now()
	if d := now.Sub(l.last); d > 0 {
		l.tokens = min(l.tokens+d.Seconds()*l.rate, float64(l.burst))
		l.last = now
	}
	return l.last
}

func (l *Limiter) sleepUntil(ctx context.Context, t time.Time) error {
	d := t.Sub(l.clk.Now())
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// LimitReaderAt returns r with every ReadAt first waiting on l for len(p)
// bytes; a ReadAt after ctx ended returns ctx.Err() and reads nothing.
// With a nil l it returns r itself. Safe for concurrent use when r is.
func LimitReaderAt(ctx context.Context, r io.ReaderAt, l *Limiter) io.ReaderAt {
	if l == nil {
		return r
	}
	return &limitedReaderAt{ctx: ctx, r: r, l: l}
}

// SliceAt hands out the source's bytes in place, after waiting for them
// as ReadAt does; ErrNoSlice when the source cannot.
func (r *limitedReaderAt) SliceAt(off int64, n int) ([]byte, error) {
	if _, ok := r.r.(SliceReaderAt); !ok {
		return nil, ErrNoSlice
	}
	if err := r.l.Wait(r.ctx, n); err != nil {
		return nil, err
	}
	return SliceAt(r.r, off, n)
}

// LimitWriterAt returns w with every WriteAt first waiting on l for len(p)
// bytes; a WriteAt after ctx ended returns ctx.Err() and writes nothing.
// With a nil l it returns w itself. Safe for concurrent use when w is.
func LimitWriterAt(ctx context.Context, w io.WriterAt, l *Limiter) io.WriterAt {
	if l == nil {
		return w
	}
	return &limitedWriterAt{ctx: ctx, w: w, l: l}
}

type limitedReaderAt struct {
	ctx context.Context
	r   io.ReaderAt
	l   *Limiter
}

func (r *limitedReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if err := r.l.Wait(r.ctx, len(p)); err != nil {
		return 0, err
	}
	return r.r.ReadAt(p, off)
}

type limitedWriterAt struct {
	ctx context.Context
	w   io.WriterAt
	l   *Limiter
}

func (w *limitedWriterAt) WriteAt(p []byte, off int64) (int, error) {
	if err := w.l.Wait(w.ctx, len(p)); err != nil {
		return 0, err
	}
	return w.w.WriteAt(p, off)
}
