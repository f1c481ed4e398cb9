package tiers

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
)

// S3Error is what an S3Store returns: the operation, where it went, and how
// many attempts were made. It never carries credentials.
type S3Error struct {
	Op       string // put, get, size, list, delete
	Endpoint string // scheme://host:port
	Bucket   string
	Key      string // the object key (or list prefix), with the store's prefix
	Attempts int    // attempts of the request that failed
	Elapsed  time.Duration
	Err      error
}

func (e *S3Error) Error() string {
	msg := fmt.Sprintf("tiers: s3 %s of %q in bucket %q at %s", e.Op, e.Key, e.Bucket, e.Endpoint)
	if e.Key == "" {
		msg = fmt.Sprintf("tiers: s3 %s of bucket %q at %s", e.Op, e.Bucket, e.Endpoint)
	}
	if e.Attempts > 1 {
		msg += fmt.Sprintf(": gave up after %d attempts in %v", e.Attempts, e.Elapsed.Round(time.Millisecond))
	}
	return msg + ": " + e.Err.Error()
}

// Unwrap exposes the cause and, for a missing object or bucket, ErrNotExist.
func (e *S3Error) Unwrap() []error {
	if isS3NotFound(e.Err) {
		return []error{e.Err, ErrNotExist}
	}
	return []error{e.Err}
}

// s3SourceError marks a failure to read the caller's source or write the
// caller's destination: not the store's fault, never retried.
type s3SourceError struct{ err error }

func (e *s3SourceError) Error() string { return e.err.Error() }
func (e *s3SourceError) Unwrap() error { return e.err }

// s3ShortObjectError says an object is shorter than a range asked of it:
// what the object is, never retried.
type s3ShortObjectError struct{ err error }

func (e *s3ShortObjectError) Error() string { return e.err.Error() }
func (e *s3ShortObjectError) Unwrap() error { return e.err }

// errS3Changed says the object was replaced while a Get read it.
var errS3Changed = errors.New("object changed while it was read")

func isS3NotFound(err error) bool {
	var r minio.ErrorResponse
	if !errors.As(err, &r) {
		return false
	}
	switch r.Code {
	case minio.NoSuchKey, minio.NoSuchBucket, "NotFound":
		return true
	}
	return false
}

func s3Code(err error) string {
	var r minio.ErrorResponse
	if errors.As(err, &r) {
		return r.Code
	}
	return ""
}

// s3Retryable reports whether err is transient: a 5xx, a throttle, a timeout,
// a refused or reset connection. ctx is the caller's: once it is done
// nothing is retried.
func s3Retryable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	var src *s3SourceError
	var short *s3ShortObjectError
	if errors.As(err, &src) || errors.As(err, &short) {
		return false
	}
	var r minio.ErrorResponse
	if errors.As(err, &r) && (r.StatusCode != 0 || r.Code != "") {
		switch r.Code {
		case "RequestTimeout", "RequestTimeTooSkewed", "SlowDown", "SlowDownRead", "SlowDownWrite",
			"InternalError", "ServiceUnavailable", "Throttling", "ThrottlingException",
			"RequestThrottled", "XMinioServerNotInitialized", "XMinioReadQuorum", "XMinioWriteQuorum":
			return true
		}
		return r.StatusCode >= 500 || r.StatusCode == http.StatusRequestTimeout || r.StatusCode == http.StatusTooManyRequests
	}
	var cert x509.UnknownAuthorityError
	var host x509.HostnameError
	if errors.As(err, &cert) || errors.As(err, &host) {
		return false
	}
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), // one attempt's timeout
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.As(err, &ne), errors.As(err, &ue):
		return true
	}
	return false
}

// s3Retrier runs one request with bounded, jittered exponential backoff.
type s3Retrier struct {
	cfg     *S3Config
	sleep   func(ctx context.Context, d time.Duration) error // time.Sleep honouring ctx; tests replace it
	watcher atomic.Pointer[RetryFunc]                        // WatchRetries
}

// RetryFunc is told of a request that failed and is about to be retried.
type RetryFunc func(op, name string, attempt int, err error)

// RetryWatcher is a store that retries failed requests inside one call
// (the object store, for up to RetryTimeout): WatchRetries has it tell f
// of each retry, so that the caller can show the tier degraded while a
// call is still going on. f is called from the calling goroutine of the
// store's method and must not block.
type RetryWatcher interface {
	WatchRetries(f RetryFunc)
}

// WatchRetries implements RetryWatcher.
func (s *S3Store) WatchRetries(f RetryFunc) { s.retrier.watcher.Store(&f) }

// backoff is the wait before retry n (n >= 1): RetryBase doubling up to
// RetryMax, with the upper half jittered so that parallel parts spread out.
func (r *s3Retrier) backoff(n int) time.Duration {
	d := r.cfg.RetryMax
	if n < 32 {
		d = min(r.cfg.RetryMax, r.cfg.RetryBase<<(n-1))
	}
	half := d / 2
	return half + rand.N(half+1)
}

// again says whether a call that failed transiently after attempts
// attempts, elapsed since it began, may be tried again, and the wait
// before it: within MaxAttempts, and not waiting past RetryTimeout.
func (r *s3Retrier) again(attempts int, elapsed time.Duration) (time.Duration, bool) {
	if attempts >= r.cfg.MaxAttempts {
		return 0, false
	}
	wait := r.backoff(attempts)
	return wait, elapsed+wait <= r.cfg.RetryTimeout
}

// do calls f until it succeeds, fails permanently, or the attempts or time
// run out. Each attempt gets a context bounded by RequestTimeout. It
// returns the last error and the number of attempts.
func (r *s3Retrier) do(ctx context.Context, op, name string, f func(ctx context.Context) error) (int, time.Duration, error) {
	start := r.cfg.Clock.Now()
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
		err := f(actx)
		cancel()
		elapsed := r.cfg.Clock.Now().Sub(start)
		if err == nil {
			return attempt, elapsed, nil
		}
		if ctx.Err() != nil {
			return attempt, elapsed, context.Cause(ctx)
		}
		if !s3Retryable(ctx, err) {
			return attempt, elapsed, err
		}
		wait, ok := r.again(attempt, elapsed)
		if !ok {
			return attempt, elapsed, err
		}
		if r.cfg.OnRetry != nil {
			r.cfg.OnRetry(op, name, attempt, err)
		}
		if w := r.watcher.Load(); w != nil {
			(*w)(op, name, attempt, err)
		}
		r.cfg.Logger.Warn("tiers: s3 request failed, retrying", "op", op, "name", name,
			"attempt", attempt, "wait", wait, "err", err)
		if err := r.sleep(ctx, wait); err != nil {
			return attempt, r.cfg.Clock.Now().Sub(start), err
		}
	}
}
