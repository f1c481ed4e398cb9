package tiers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"rewind.dev/rewind/internal/miniotest"
)

// newS3 starts a MinIO server and returns a store on it under the prefix
// "ckpt/", with 5 MiB parts (S3's minimum), so that small objects already
// take several parts, and quick retries.
func newS3(t *testing.T, edit func(*S3Config)) (*S3Store, *miniotest.Server) {
	t.Helper()
	srv := miniotest.Start(t)
	return newS3On(t, srv, edit), srv
}

func newS3On(t *testing.T, srv *miniotest.Server, edit func(*S3Config)) *S3Store {
	t.Helper()
	cfg := DefaultS3Config()
	cfg.URL = "s3://" + srv.Bucket + "/ckpt"
	cfg.Endpoint = srv.URL()
	cfg.AccessKey, cfg.SecretKey = Secret(srv.AccessKey), Secret(srv.SecretKey)
	cfg.PartSize = s3MinPartSize
	cfg.Parallel = 3
	cfg.RetryBase = 50 * time.Millisecond
	cfg.RetryMax = 500 * time.Millisecond
	cfg.RetryTimeout = 30 * time.Second
	cfg.MaxAttempts = 200 // bounded by RetryTimeout in these tests
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if edit != nil {
		edit(&cfg)
	}
	s, err := NewS3Store(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckBucket(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

func s3Rand(seed uint64, n int64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i < len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// s3Buf is an io.WriterAt over memory that grows as needed.
type s3Buf struct {
	mu sync.Mutex
	b  []byte
}

func (w *s3Buf) WriteAt(p []byte, off int64) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if end := off + int64(len(p)); end > int64(len(w.b)) {
		w.b = append(w.b, make([]byte, end-int64(len(w.b)))...)
	}
	return copy(w.b[off:], p), nil
}

func s3MustGet(t *testing.T, s *S3Store, name string) []byte {
	t.Helper()
	var w s3Buf
	n, err := s.Get(t.Context(), name, &w)
	if err != nil {
		t.Fatalf("Get(%s): %v", name, err)
	}
	if n != int64(len(w.b)) {
		t.Fatalf("Get(%s) returned size %d, wrote %d bytes", name, n, len(w.b))
	}
	return w.b
}

func TestS3RoundTrip(t *testing.T) {
	s, srv := newS3(t, nil)
	const ps = s3MinPartSize
	sizes := map[string]int64{
		"empty":              0,
		"one byte":           1,
		"one part less one":  ps - 1,
		"exactly one part":   ps,
		"one part and one":   ps + 1,
		"5 MiB and 3":        5<<20 + 3,
		"three parts and 7":  3*ps + 7,
		"more parts than in": 7*ps + 12345, // more parts than Parallel
	}
	for name, size := range sizes {
		t.Run(name, func(t *testing.T) {
			obj := "job/step-1/" + strings.ReplaceAll(name, " ", "-")
			want := s3Rand(uint64(size), size)
			if err := s.Put(t.Context(), obj, bytes.NewReader(want), size); err != nil {
				t.Fatal(err)
			}
			if got, err := s.Size(t.Context(), obj); err != nil || got != size {
				t.Fatalf("Size = %d, %v; want %d", got, err, size)
			}
			if got := s3MustGet(t, s, obj); !bytes.Equal(got, want) {
				t.Fatalf("Get returned %d bytes that differ from the %d put", len(got), size)
			}
			// The object lies under the store's prefix, and the server
			// holds the whole-object CRC32C of exactly these bytes.
			info, err := srv.Client().StatObject(t.Context(), srv.Bucket, "ckpt/"+obj, minio.StatObjectOptions{Checksum: true})
			if err != nil {
				t.Fatal(err)
			}
			if wantSum := s3CRCString(crc32.Checksum(want, s3Castagnoli)); info.ChecksumCRC32C != wantSum {
				t.Errorf("server CRC32C %q (%s), want %q", info.ChecksumCRC32C, info.ChecksumMode, wantSum)
			}
		})
	}
}

func TestS3ListDeleteSizeNotExist(t *testing.T) {
	s, _ := newS3(t, nil)
	ctx := t.Context()
	names := []string{"b/x", "a/2", "ab", "a/1", "a/sub/3"}
	for i, n := range names {
		if err := s.Put(ctx, n, bytes.NewReader([]byte(n)), int64(len(n))); err != nil {
			t.Fatalf("Put(%s) #%d: %v", n, i, err)
		}
	}
	for prefix, want := range map[string][]string{
		"":      {"a/1", "a/2", "a/sub/3", "ab", "b/x"},
		"a/":    {"a/1", "a/2", "a/sub/3"},
		"a":     {"a/1", "a/2", "a/sub/3", "ab"},
		"a/s":   {"a/sub/3"},
		"c":     nil,
		"b/x":   {"b/x"},
		"b/x/y": nil,
	} {
		got, err := s.List(ctx, prefix)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("List(%q) = %q, %v; want %q", prefix, got, err, want)
		}
	}
	if err := s.Delete(ctx, "a/2"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "a/2"); err != nil {
		t.Fatalf("deleting a missing object: %v", err)
	}
	if got, _ := s.List(ctx, "a/"); !slices.Equal(got, []string{"a/1", "a/sub/3"}) {
		t.Errorf("after Delete, List(a/) = %q", got)
	}
	_, err := s.Size(ctx, "a/2")
	if !IsNotExist(err) {
		t.Fatalf("Size of a deleted object: %v, want a not-exist error", err)
	}
	for _, part := range []string{"size", `"ckpt/a/2"`, `"rewind-test"`, "127.0.0.1:"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %q does not name %s", err, part)
		}
	}
	if _, err := s.Get(ctx, "nope", &s3Buf{}); !IsNotExist(err) {
		t.Errorf("Get of a missing object: %v, want a not-exist error", err)
	}
	for _, bad := range []string{"", "/abs", "a/../b", "a//b", "./a", "a/"} {
		if err := s.Put(ctx, bad, bytes.NewReader(nil), 0); err == nil {
			t.Errorf("Put(%q) accepted an invalid name", bad)
		}
	}
}

// s3HookReader calls before on each ReadAt, then reads from b.
type s3HookReader struct {
	b      []byte
	before func(off int64)
}

func (r *s3HookReader) ReadAt(p []byte, off int64) (int, error) {
	r.before(off)
	return bytes.NewReader(r.b).ReadAt(p, off)
}

// s3AssertOld checks that name still holds old, and that no multipart upload
// of it is left on the server (unless leftOK).
func s3AssertOld(t *testing.T, s *S3Store, srv *miniotest.Server, name string, old []byte, leftOK bool) {
	t.Helper()
	if got := s3MustGet(t, s, name); !bytes.Equal(got, old) {
		t.Fatalf("the earlier object was damaged: %d bytes, want its %d", len(got), len(old))
	}
	if leftOK {
		return
	}
	for u := range srv.Client().ListIncompleteUploads(t.Context(), srv.Bucket, "ckpt/"+name, true) {
		if u.Err != nil {
			t.Fatal(u.Err)
		}
		t.Errorf("multipart upload %s of %s left behind", u.UploadID, u.Key)
	}
}

func TestS3PutCancelledLeavesOldObject(t *testing.T) {
	s, srv := newS3(t, nil)
	old := s3Rand(1, 2*s3MinPartSize+5)
	if err := s.Put(t.Context(), "x", bytes.NewReader(old), int64(len(old))); err != nil {
		t.Fatal(err)
	}
	for name, cancelAt := range map[string]int64{
		"multipart, after two parts": 2 * s3MinPartSize,
		"single put, at the start":   0,
	} {
		t.Run(name, func(t *testing.T) {
			size := int64(8*s3MinPartSize + 1)
			if cancelAt == 0 {
				size = s3MinPartSize / 2
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			src := &s3HookReader{b: s3Rand(2, size), before: func(off int64) {
				if off >= cancelAt {
					cancel()
				}
			}}
			err := s.Put(ctx, "x", src, size)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Put returned %v, want context.Canceled", err)
			}
			s3AssertOld(t, s, srv, "x", old, false)
		})
	}
}

// TestS3ServerRestartMidUpload kills MinIO in the middle of a multipart
// upload and starts it again once the store has retried a request: the
// store retries the parts that failed, and the Put completes whole.
func TestS3ServerRestartMidUpload(t *testing.T) {
	var retries atomic.Int64
	retried := make(chan struct{})
	var firstRetry sync.Once
	s, srv := newS3(t, func(c *S3Config) {
		c.OnRetry = func(op, name string, attempt int, err error) {
			retries.Add(1)
			firstRetry.Do(func() { close(retried) })
		}
	})
	old := s3Rand(3, s3MinPartSize+9)
	if err := s.Put(t.Context(), "x", bytes.NewReader(old), int64(len(old))); err != nil {
		t.Fatal(err)
	}
	size := int64(10*s3MinPartSize + 77)
	want := s3Rand(4, size)
	var once sync.Once
	restarted := make(chan error, 1)
	src := &s3HookReader{b: want, before: func(off int64) {
		if off < 4*s3MinPartSize {
			return
		}
		once.Do(func() {
			if err := srv.Kill(); err != nil {
				t.Error(err)
			}
			go func() {
				select { // the server is down while the store notices
				case <-retried:
				case <-t.Context().Done():
				}
				restarted <- srv.Start()
			}()
		})
	}}
	start := time.Now()
	if err := s.Put(t.Context(), "x", src, size); err != nil {
		t.Fatalf("Put across a server restart: %v", err)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	t.Logf("Put of %d bytes across a restart took %v with %d retries", size, time.Since(start), retries.Load())
	if retries.Load() == 0 {
		t.Error("no request was retried: the server was not down during the upload")
	}
	if got := s3MustGet(t, s, "x"); !bytes.Equal(got, want) {
		t.Fatal("the object differs from what was put")
	}
}

// TestS3ServerDownPutFails kills MinIO in the middle of a multipart upload
// and keeps it down past the retry budget: the Put fails with an error
// naming the endpoint, bucket and object; once MinIO is back, the earlier
// object is intact and nothing partial is visible.
func TestS3ServerDownPutFails(t *testing.T) {
	s, srv := newS3(t, func(c *S3Config) { c.RetryTimeout = 1500 * time.Millisecond })
	old := s3Rand(5, 3*s3MinPartSize)
	if err := s.Put(t.Context(), "x", bytes.NewReader(old), int64(len(old))); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	size := int64(10 * s3MinPartSize)
	src := &s3HookReader{b: s3Rand(6, size), before: func(off int64) {
		if off >= 4*s3MinPartSize {
			once.Do(func() {
				if err := srv.Kill(); err != nil {
					t.Error(err)
				}
			})
		}
	}}
	start := time.Now()
	err := s.Put(t.Context(), "x", src, size)
	took := time.Since(start)
	if err == nil {
		t.Fatal("Put succeeded with the server down")
	}
	t.Logf("Put failed after %v: %v", took, err)
	if took > 15*time.Second {
		t.Errorf("Put took %v to give up; the retry budget is 1.5 s per request", took)
	}
	for _, part := range []string{"put", `"ckpt/x"`, `"rewind-test"`, srv.URL(), "gave up after"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error does not name %s: %v", part, err)
		}
	}
	if strings.Contains(err.Error(), srv.SecretKey) || strings.Contains(err.Error(), srv.AccessKey) {
		t.Errorf("error shows the credentials: %v", err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// The abort could not reach the server, so the upload may remain on
	// it, invisible; the object is the old one.
	s3AssertOld(t, s, srv, "x", old, true)
	if names, err := s.List(t.Context(), ""); err != nil || !slices.Equal(names, []string{"x"}) {
		t.Errorf("List = %q, %v; want only x", names, err)
	}
}

// TestS3ServerRejectsWrongChecksum: a source whose bytes change between
// the CRC pass and the send (a torn source) is refused by the server, and
// the earlier object stays.
func TestS3ServerRejectsWrongChecksum(t *testing.T) {
	s, srv := newS3(t, nil)
	for name, size := range map[string]int64{"single put": 1000, "multipart": 3*s3MinPartSize + 1} {
		t.Run(name, func(t *testing.T) {
			obj := strings.ReplaceAll(name, " ", "-")
			old := s3Rand(7, size)
			if err := s.Put(t.Context(), obj, bytes.NewReader(old), size); err != nil {
				t.Fatal(err)
			}
			data := s3Rand(8, size)
			var reads sync.Map // offset -> times read
			src := &s3HookReader{b: data, before: func(off int64) {
				if off != 0 {
					return
				}
				if n, loaded := reads.LoadOrStore(off, 1); loaded && n == 1 {
					reads.Store(off, 2)
					data[0] ^= 0xff // the second read of the first part differs
				}
			}}
			err := s.Put(t.Context(), obj, src, size)
			if err == nil {
				t.Fatal("the server accepted bytes that do not match their CRC32C")
			}
			t.Logf("rejected: %v", err)
			var se *S3Error
			if !errors.As(err, &se) || se.Attempts != 1 {
				t.Errorf("a checksum mismatch was retried or not an S3Error: %#v", err)
			}
			s3AssertOld(t, s, srv, obj, old, false)
		})
	}
}

// TestS3ConcurrentPutsAndGets: concurrent Puts of one name with different
// contents, and Gets beside them: every Get returns one whole version.
func TestS3ConcurrentPutsAndGets(t *testing.T) {
	s, _ := newS3(t, nil)
	size := int64(2*s3MinPartSize + 100)
	versions := [][]byte{s3Rand(10, size), s3Rand(11, size), s3Rand(12, size)}
	if err := s.Put(t.Context(), "x", bytes.NewReader(versions[0]), size); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			v := versions[i%len(versions)]
			if err := s.Put(t.Context(), "x", bytes.NewReader(v), size); err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			var w s3Buf
			if _, err := s.Get(t.Context(), "x", &w); err != nil {
				t.Error(err)
				return
			}
			if !slices.ContainsFunc(versions, func(v []byte) bool { return bytes.Equal(v, w.b) }) {
				t.Error("a Get returned a mix of versions")
			}
		})
	}
	wg.Wait()
}

// TestS3ShortSource: a source shorter than the size given is the caller's
// error: not retried, and the earlier object stays. A missing bucket is a
// not-exist error.
func TestS3ShortSourceAndMissingBucket(t *testing.T) {
	s, srv := newS3(t, nil)
	old := []byte("old")
	if err := s.Put(t.Context(), "x", bytes.NewReader(old), 3); err != nil {
		t.Fatal(err)
	}
	for _, size := range []int64{100, 3*s3MinPartSize + 1} {
		err := s.Put(t.Context(), "x", bytes.NewReader(make([]byte, size-1)), size)
		var se *S3Error
		if !errors.As(err, &se) || se.Attempts > 1 || !strings.Contains(err.Error(), "reading source") {
			t.Errorf("Put of %d bytes from a shorter source: %v", size, err)
		}
	}
	s3AssertOld(t, s, srv, "x", old, false)

	other := newS3On(t, srv, nil)
	other.bucket = "no-such-bucket"
	if err := other.CheckBucket(t.Context()); !IsNotExist(err) {
		t.Errorf("CheckBucket of a missing bucket: %v", err)
	}
	if _, err := other.Size(t.Context(), "x"); !IsNotExist(err) {
		t.Errorf("Size in a missing bucket: %v", err)
	}
}

// s3FlipTransport corrupts the first byte of every ranged GET's body while on.
type s3FlipTransport struct{ on atomic.Bool }

func (f *s3FlipTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && f.on.Load() && req.Method == http.MethodGet && req.Header.Get("Range") != "" {
		resp.Body = &s3FlipFirst{ReadCloser: resp.Body}
	}
	return resp, err
}

type s3FlipFirst struct {
	io.ReadCloser
	done bool
}

func (f *s3FlipFirst) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if n > 0 && !f.done {
		p[0] ^= 1
		f.done = true
	}
	return n, err
}

// TestS3GetDetectsCorruption: bytes damaged between the server and dst
// fail the Get against the whole-object CRC32C the server stored.
func TestS3GetDetectsCorruption(t *testing.T) {
	ft := &s3FlipTransport{}
	s, _ := newS3(t, func(c *S3Config) { c.Transport = ft })
	for _, size := range []int64{10, 2*s3MinPartSize + 1} {
		name := fmt.Sprint("x", size)
		if err := s.Put(t.Context(), name, bytes.NewReader(s3Rand(9, size)), size); err != nil {
			t.Fatal(err)
		}
		ft.on.Store(true)
		_, err := s.Get(t.Context(), name, &s3Buf{})
		ft.on.Store(false)
		if err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
			t.Errorf("Get of %d corrupted bytes: %v, want a checksum mismatch", size, err)
		}
		s3MustGet(t, s, name)
	}
}
