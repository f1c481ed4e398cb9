package tiers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/miniotest"
)

// The S3 tier against a real MinIO, with faults injected into its HTTP
// transport (faultinject's s3/request point): what a user relies on is
// that transient failures are ridden out and the object lands
// bit-identical, that bytes damaged on the way back are never returned as
// good, and that a hung request gives up when the caller's deadline says.

// newFaultyS3 starts MinIO and returns a store whose requests go through
// an injector (nothing armed yet), and a count of the requests it retried.
func newFaultyS3(t *testing.T, edit func(*S3Config)) (*S3Store, *miniotest.Server, *faultinject.Injector, *atomic.Int64) {
	t.Helper()
	in := faultinject.New(nil, 1)
	var retries atomic.Int64
	s, srv := newS3(t, func(c *S3Config) {
		c.Transport = in.Transport(nil)
		c.OnRetry = func(op, name string, attempt int, err error) { retries.Add(1) }
		if edit != nil {
			edit(c)
		}
	})
	return s, srv, in, &retries
}

// s3AssertStored checks that name holds exactly want: read back through
// the store, and by the server's own CRC32C of the object; and that no
// multipart upload of it is left behind.
func s3AssertStored(t *testing.T, s *S3Store, srv *miniotest.Server, name string, want []byte) {
	t.Helper()
	if got := s3MustGet(t, s, name); !bytes.Equal(got, want) {
		t.Fatalf("%s reads back as %d bytes that differ from the %d put", name, len(got), len(want))
	}
	info, err := srv.Client().StatObject(t.Context(), srv.Bucket, "ckpt/"+name, minio.StatObjectOptions{Checksum: true})
	if err != nil {
		t.Fatal(err)
	}
	if sum := s3CRCString(crc32.Checksum(want, s3Castagnoli)); info.ChecksumCRC32C != sum {
		t.Fatalf("server CRC32C of %s is %q, the bytes put have %q", name, info.ChecksumCRC32C, sum)
	}
	s3AssertOld(t, s, srv, name, want, false)
}

// TestS3InjectedTransientFailuresRetried: 503 SlowDown answers and reset
// connections, on a single-request upload, on the parts of a multipart
// upload and on its completion, are retried; the upload succeeds and the
// object is bit-identical.
func TestS3InjectedTransientFailuresRetried(t *testing.T) {
	s, srv, in, retries := newFaultyS3(t, nil)
	var watched atomic.Int64 // what an agent shows as a degraded tier (RetryWatcher)
	var w RetryWatcher = s
	w.WatchRetries(func(op, name string, attempt int, err error) { watched.Add(1) })
	single := int64(1<<20 + 3)
	multi := int64(s3MinPartSize + 4099) // two parts
	type testcase struct {
		size  int64
		spec  string // s3/request term
		fires uint64 // how often it must fire in the Put
	}
	cases := map[string]testcase{
		// A single put is one request per attempt.
		"single, 3x503":   {single, "3*status(503)", 3},
		"single, 2xreset": {single, "2*reset", 2},
		// Request 1 creates the upload; the next ones are its two parts.
		"parts, 3x503":   {multi, "1*off->3*status(503)", 3},
		"parts, 2xreset": {multi, "1*off->2*reset", 2},
		// Requests 1-3 create the upload and send its parts; 4 completes it.
		"completion, 3x503":   {multi, "3*off->3*status(503)", 3},
		"completion, 2xreset": {multi, "3*off->2*reset", 2},
	}
	n := 0
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			n++
			obj := fmt.Sprintf("job/step-%d/rank-0", n)
			want := s3Rand(uint64(n), tc.size)
			in.Clear()
			before, hits := retries.Load(), in.Hits()[faultinject.S3Request]
			if err := in.Set("s3/request=" + tc.spec); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err := s.Put(t.Context(), obj, bytes.NewReader(want), tc.size)
			in.Clear()
			if err != nil {
				t.Fatalf("Put under %s: %v", tc.spec, err)
			}
			if fired := in.Hits()[faultinject.S3Request] - hits; fired != tc.fires {
				t.Fatalf("s3/request fired %d times in the Put, want %d", fired, tc.fires)
			}
			if r := retries.Load() - before; r < int64(tc.fires) {
				t.Fatalf("%d requests retried, want at least %d", r, tc.fires)
			}
			if watched.Load() != retries.Load() {
				t.Fatalf("the retry watcher heard of %d retries, OnRetry of %d", watched.Load(), retries.Load())
			}
			t.Logf("Put of %d bytes under %s took %v", tc.size, tc.spec, time.Since(start).Round(time.Millisecond))
			s3AssertStored(t, s, srv, obj, want)
		})
	}
}

// TestS3InjectedCorruptDownloadRefused: a bit flipped in the body of a
// ranged GET is caught against the whole-object CRC32C the server stored.
// The store does not retry it: the Get fails with a checksum mismatch (a
// restore falls back to another copy), and a later Get reads the object
// whole. Through GetShard (a restore from this tier) the damaged shard is
// refused, never handed back.
func TestS3InjectedCorruptDownloadRefused(t *testing.T) {
	s, _, in, retries := newFaultyS3(t, nil)
	ctx := t.Context()

	for name, size := range map[string]int64{"one range": 1<<20 + 5, "two ranges": s3MinPartSize + 777} {
		t.Run(name, func(t *testing.T) {
			obj := "x-" + strings.ReplaceAll(name, " ", "-")
			want := s3Rand(uint64(size), size)
			if err := s.Put(ctx, obj, bytes.NewReader(want), size); err != nil {
				t.Fatal(err)
			}
			before := retries.Load()
			// A Get stats the object first (no body), then reads its ranges.
			if err := in.Set("s3/request=1*off->1*corrupt"); err != nil {
				t.Fatal(err)
			}
			hits := in.Hits()[faultinject.S3Request]
			var w s3Buf
			_, err := s.Get(ctx, obj, &w)
			in.Clear()
			if in.Hits()[faultinject.S3Request] != hits+1 {
				t.Fatal("the corrupt fault did not fire")
			}
			var se *S3Error
			if err == nil || !errors.As(err, &se) || !strings.Contains(err.Error(), "checksum mismatch") {
				t.Fatalf("Get of a range damaged in transit: %v, want an S3Error with a checksum mismatch", err)
			}
			if r := retries.Load() - before; r != 0 {
				t.Errorf("the damaged Get was retried %d times; the code refuses it", r)
			}
			if got := s3MustGet(t, s, obj); !bytes.Equal(got, want) {
				t.Fatal("the Get after the damaged one differs from what was put")
			}
		})
	}

	t.Run("restore", func(t *testing.T) {
		const job, step = "job", 5
		shard, e := faultShard(t, job, step, 2<<20+333, 5)
		saveStep(t, s, job, step, shard, e)
		m, err := ReadManifest(ctx, s, job, step)
		if err != nil {
			t.Fatal(err)
		}
		if err := in.Set("s3/request=1*off->1*corrupt"); err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, len(shard))
		err = GetShard(ctx, s, m, 0, dst, 2)
		in.Clear()
		if err == nil {
			t.Fatal("GetShard returned a shard damaged in transit as good")
		}
		t.Logf("damaged restore refused: %v", err)
		clear(dst)
		if err := GetShard(ctx, s, m, 0, dst, 2); err != nil || !bytes.Equal(dst, shard) {
			t.Fatalf("restore after the damaged one: %v, bit-identical %v", err, bytes.Equal(dst, shard))
		}
	})
}

// TestS3AbortRetried: a multipart upload fails on a part (503 on both of
// its tries), and the first request of its abort meets a 503 too: the
// abort is retried like any other request, and no upload is left behind
// to be billed until the bucket's lifecycle rule finds it.
func TestS3AbortRetried(t *testing.T) {
	s, srv, in, _ := newFaultyS3(t, func(c *S3Config) { c.Parallel, c.MaxAttempts = 1, 2 }) // part 2 never starts
	old := s3Rand(1, 1<<20)
	if err := s.Put(t.Context(), "x", bytes.NewReader(old), int64(len(old))); err != nil {
		t.Fatal(err)
	}
	// Request 1 creates the upload, 2 and 3 send part 1, 4 is the abort's
	// first.
	if err := in.Set("s3/request=1*off->3*status(503)"); err != nil {
		t.Fatal(err)
	}
	hits := in.Hits()[faultinject.S3Request]
	multi := int64(s3MinPartSize + 1)
	err := s.Put(t.Context(), "x", bytes.NewReader(s3Rand(2, multi)), multi)
	fired := in.Hits()[faultinject.S3Request] - hits
	in.Clear()
	if err == nil || !strings.Contains(err.Error(), "part 1") {
		t.Fatalf("Put whose first part was refused: %v, want an error naming part 1", err)
	}
	if fired != 3 {
		t.Fatalf("s3/request fired %d times, want 3 (the part's two tries and the abort's first)", fired)
	}
	s3AssertOld(t, s, srv, "x", old, false)
}

// TestS3InjectedTimeout: a request that hangs (the server never answers)
// ends when the caller's deadline does: Put and Get return an error that
// is context.DeadlineExceeded, promptly, and the earlier object stays. A
// hang cut by the store's own RequestTimeout, with the caller still
// waiting, is retried and the Put succeeds.
func TestS3InjectedTimeout(t *testing.T) {
	s, srv, in, _ := newFaultyS3(t, func(c *S3Config) { c.RequestTimeout = 500 * time.Millisecond })
	old := s3Rand(1, 1<<20)
	if err := s.Put(t.Context(), "x", bytes.NewReader(old), int64(len(old))); err != nil {
		t.Fatal(err)
	}
	const deadline = 300 * time.Millisecond
	const slack = 2 * time.Second // the race detector and a loaded machine

	check := func(t *testing.T, what string, err error, took time.Duration) {
		t.Helper()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s with every request hanging: %v, want context.DeadlineExceeded", what, err)
		}
		if took < deadline || took > deadline+slack {
			t.Fatalf("%s with a %v deadline returned after %v", what, deadline, took)
		}
		t.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
	}
	bounded := func(t *testing.T, what string, f func(ctx context.Context) error) {
		t.Helper()
		start := time.Now() // before the deadline is set: the deadline is deadline after this at most
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()
		err := f(ctx)
		check(t, what, err, time.Since(start))
	}

	if err := in.Set("s3/request=timeout"); err != nil {
		t.Fatal(err)
	}
	bounded(t, "single Put", func(ctx context.Context) error {
		return s.Put(ctx, "x", bytes.NewReader(s3Rand(2, 1<<20)), 1<<20)
	})
	bounded(t, "Get", func(ctx context.Context) error {
		_, err := s.Get(ctx, "x", &s3Buf{})
		return err
	})
	// A multipart upload whose two parts hang: the upload is created, the
	// parts hang until the deadline, and the abort afterwards gets through
	// (retried, should it meet a hang meant for a part that never started
	// its request). The deadline starts as the first part is read, once the
	// upload exists: an upload whose creation outlived the caller's
	// deadline has no id the store could abort, and only the bucket's
	// lifecycle rule removes it (docs/tiers.md).
	multi := int64(s3MinPartSize + 1)
	if err := in.Set("s3/request=1*off->2*timeout"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	var began time.Time
	var once sync.Once
	src := &s3HookReader{b: s3Rand(3, multi), before: func(int64) {
		once.Do(func() {
			began = time.Now()
			time.AfterFunc(deadline, func() { cancel(context.DeadlineExceeded) })
		})
	}}
	err := s.Put(ctx, "x", src, multi)
	took := time.Since(began)
	cancel(nil)
	check(t, "multipart Put", err, took)
	in.Clear()
	s3AssertOld(t, s, srv, "x", old, false)

	// No caller deadline: the store's RequestTimeout cuts the hung request
	// and the retry goes through.
	if err := in.Set("s3/request=1*timeout"); err != nil {
		t.Fatal(err)
	}
	want := s3Rand(4, 1<<20)
	start := time.Now()
	if err := s.Put(t.Context(), "y", bytes.NewReader(want), int64(len(want))); err != nil {
		t.Fatalf("Put with one hung request: %v", err)
	}
	if took := time.Since(start); took < 500*time.Millisecond || took > 500*time.Millisecond+slack {
		t.Fatalf("Put with one request hung for the 500ms request timeout took %v", took)
	}
	in.Clear()
	s3AssertStored(t, s, srv, "y", want)
}
