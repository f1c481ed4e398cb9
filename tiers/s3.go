package tiers

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"rewind.dev/rewind/internal/clock"
)

// S3Store is a Store in an S3-compatible object store (MinIO, AWS S3),
// through minio-go.
//
// Put streams straight from the caller's io.ReaderAt: an object larger
// than one part is a multipart upload of Parallel parts at a time, each
// part read twice from the source (once for its CRC32C, once to send it),
// never copied whole into the heap. Every part carries its CRC32C, which
// the server checks before it accepts the part, and the completion carries
// the CRC32C of the whole object (a FULL_OBJECT checksum), which the server
// checks against the parts. Get reads Parallel ranges at a time, pinned to
// the ETag the object had when the Get began, and checks the whole-object
// CRC32C the server stored; an object replaced meanwhile by a concurrent
// Put is read again, the new version whole, within the retry bounds below.
//
// Each request (a part, a range, a stat) is retried on transient failures
// (5xx, throttling, refused or reset connections, timeouts) with jittered
// exponential backoff, bounded by MaxAttempts and RetryTimeout; a Put whose
// requests cannot get through fails and aborts its multipart upload, so no
// partial object is ever visible and an earlier object of the name is
// untouched: S3 replaces an object only when an upload completes. A failed
// or cancelled multipart Put returns once its abort is done, 10 s at most.
//
// An S3Store is safe for concurrent use.
type S3Store struct {
	cfg      S3Config
	core     *minio.Core
	bucket   string
	prefix   string // "" or ending in "/"
	endpoint string // scheme://host:port, for messages
	retrier  s3Retrier
}

var _ Store = (*S3Store)(nil)

// NewS3Store validates cfg, resolves its credentials and returns a store.
// It makes no request; CheckBucket does.
func NewS3Store(cfg S3Config) (*S3Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bucket, prefix, _ := parseS3URL(cfg.URL)
	host, secure, _ := parseS3Endpoint(cfg.Endpoint, cfg.Secure)
	cfg.Secure = secure
	access, secret, token, err := cfg.s3Credentials()
	if err != nil {
		return nil, err
	}
	core, err := minio.NewCore(host, &minio.Options{
		Creds:        credentials.NewStaticV4(access.reveal(), secret.reveal(), token.reveal()),
		Secure:       secure,
		Region:       cfg.Region,
		Transport:    cfg.Transport,
		BucketLookup: minio.BucketLookupPath, // works with every S3-compatible server and any bucket name
		MaxRetries:   1,                      // the store retries, with its own bounds and errors
	})
	if err != nil {
		return nil, fmt.Errorf("tiers: s3 store at %s: %w", host, err)
	}
	core.SetAppInfo("rewind", "1")
	scheme := "http"
	if secure {
		scheme = "https"
	}
	s := &S3Store{cfg: cfg, core: core, bucket: bucket, prefix: prefix, endpoint: scheme + "://" + host}
	s.retrier.cfg, s.retrier.sleep = &s.cfg, clock.Sleep
	return s, nil
}

// MinioClient returns a new minio-go client for the store's server and
// credentials, with minio-go's own default options, and the bucket and
// key prefix the store writes under. It is for measuring the store
// against minio-go itself (internal/bench); the store never uses it, and
// objects written through it are the caller's to delete.
func (s *S3Store) MinioClient() (c *minio.Client, bucket, prefix string, err error) {
	host, secure, _ := parseS3Endpoint(s.cfg.Endpoint, s.cfg.Secure)
	access, secret, token, err := s.cfg.s3Credentials()
	if err != nil {
		return nil, "", "", err
	}
	c, err = minio.New(host, &minio.Options{
		Creds:     credentials.NewStaticV4(access.reveal(), secret.reveal(), token.reveal()),
		Secure:    secure,
		Region:    s.cfg.Region,
		Transport: s.cfg.Transport,
	})
	if err != nil {
		return nil, "", "", fmt.Errorf("tiers: minio-go client for %s: %w", host, err)
	}
	return c, s.bucket, s.prefix, nil
}

// String names the store: its URL and endpoint, never its credentials.
func (s *S3Store) String() string {
	return "s3://" + s.bucket + "/" + s.prefix + " at " + s.endpoint
}

// CheckBucket reports whether the bucket exists and the credentials reach it.
func (s *S3Store) CheckBucket(ctx context.Context) error {
	var ok bool
	err := s.retry(ctx, "check", "", "", func(ctx context.Context) (err error) {
		ok, err = s.core.BucketExists(ctx, s.bucket)
		return err
	})
	if err == nil && !ok {
		err = &S3Error{Op: "check", Endpoint: s.endpoint, Bucket: s.bucket, Err: fmt.Errorf("bucket does not exist: %w", ErrNotExist)}
	}
	return err
}

func (s *S3Store) key(name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	return s.prefix + name, nil
}

// retry runs f under the store's retry policy and wraps a final error in
// an S3Error.
func (s *S3Store) retry(ctx context.Context, op, name, key string, f func(ctx context.Context) error) error {
	n, elapsed, err := s.retrier.do(ctx, op, name, f)
	if err == nil {
		return nil
	}
	var se *S3Error
	if errors.As(err, &se) {
		return err
	}
	return &S3Error{Op: op, Endpoint: s.endpoint, Bucket: s.bucket, Key: key, Attempts: n, Elapsed: elapsed, Err: err}
}

const (
	amzChecksumCRC32C = "x-amz-checksum-crc32c"
	amzChecksumAlgo   = "x-amz-checksum-algorithm"
	amzChecksumType   = "x-amz-checksum-type"
	s3CopyBufSize     = 1 << 20 // one read or write of the caller's memory
	s3MaxParts        = 10000   // S3's limit on the parts of one upload
)

var s3Castagnoli = crc32.MakeTable(crc32.Castagnoli)

var s3CopyBufs = sync.Pool{New: func() any { b := make([]byte, s3CopyBufSize); return &b }}

func s3CRCString(c uint32) string {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], c)
	return base64.StdEncoding.EncodeToString(b[:])
}

// s3CRC returns the CRC32C of size bytes of src from off.
func s3CRC(src io.ReaderAt, off, size int64) (uint32, error) {
	bp := s3CopyBufs.Get().(*[]byte)
	defer s3CopyBufs.Put(bp)
	buf := *bp
	var c uint32
	for done := int64(0); done < size; {
		n, err := src.ReadAt(buf[:min(int64(len(buf)), size-done)], off+done)
		c = crc32.Update(c, s3Castagnoli, buf[:n])
		done += int64(n)
		if err != nil && (err != io.EOF || done < size) {
			return 0, &s3SourceError{fmt.Errorf("reading source at offset %d: %w", off+done, err)}
		}
	}
	return c, nil
}

// s3Body is a request body read from the caller's source; it remembers a
// read error so that it is reported as the source's, not retried.
//
// net/http may go on reading a request body after the round trip has
// returned (RoundTrip closes it "in a separate goroutine even after
// RoundTrip returns"), for instance when the server answered an error
// before the whole body was sent. The source is often the caller's mapped
// segment, which may be unmapped or truncated as soon as Put returns, so
// end cuts the body off: a Read after it fails without touching the
// source, and end waits for a Read in progress.
type s3Body struct {
	mu    sync.Mutex
	r     io.Reader
	err   error
	ended bool
}

// errBodyEnded is what a Read of an ended body returns.
var errBodyEnded = errors.New("tiers: s3 request body read after its request ended")

func (b *s3Body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return 0, errBodyEnded
	}
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// end cuts the body off from its source once its request returned err,
// and reports a source read error as the source's.
func (b *s3Body) end(err error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ended = true
	if b.err != nil {
		return &s3SourceError{fmt.Errorf("reading source: %w", b.err)}
	}
	return err
}

// Put stores size bytes of src as name; see S3Store.
func (s *S3Store) Put(ctx context.Context, name string, src io.ReaderAt, size int64) error {
	key, err := s.key(name)
	if err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("tiers: s3 put %q: negative size %d", name, size)
	}
	if size <= s.cfg.PartSize {
		return s.putSingle(ctx, name, key, src, size)
	}
	return s.putMultipart(ctx, name, key, src, size)
}

// s3Source prepares [off, off+l) of src for an upload: its CRC32C, and a
// function giving a fresh body for each attempt. A source that can hand
// its bytes out in place (a mapped segment, SliceReaderAt) is read once,
// straight from its memory; any other is read through ReadAt, once for
// the CRC and once per attempt.
func s3Source(src io.ReaderAt, off, l int64) (uint32, func() io.Reader, error) {
	b, err := SliceAt(src, off, int(l))
	switch {
	case err == nil:
		return crc32.Checksum(b, s3Castagnoli), func() io.Reader { return bytes.NewReader(b) }, nil
	case !errors.Is(err, ErrNoSlice):
		return 0, nil, &s3SourceError{fmt.Errorf("reading source at offset %d: %w", off, err)}
	}
	c, err := s3CRC(src, off, l)
	if err != nil {
		return 0, nil, err
	}
	return c, func() io.Reader { return io.NewSectionReader(src, off, l) }, nil
}

func (s *S3Store) putSingle(ctx context.Context, name, key string, src io.ReaderAt, size int64) error {
	c, body, err := s3Source(src, 0, size)
	if err != nil {
		return &S3Error{Op: "put", Endpoint: s.endpoint, Bucket: s.bucket, Key: key, Err: err}
	}
	sum := s3CRCString(c)
	return s.retry(ctx, "put", name, key, func(ctx context.Context) error {
		b := &s3Body{r: body()}
		_, err := s.core.PutObject(ctx, s.bucket, key, b, size, "", "", minio.PutObjectOptions{
			UserMetadata:         map[string]string{amzChecksumCRC32C: sum},
			DisableContentSha256: true, // the CRC32C guards the payload; a SHA-256 per chunk would cost more CPU than the transfer
		})
		return b.end(err)
	})
}

// Size returns the object's size.
func (s *S3Store) Size(ctx context.Context, name string) (int64, error) {
	key, err := s.key(name)
	if err != nil {
		return 0, err
	}
	info, err := s.stat(ctx, "size", name, key)
	if err != nil {
		return 0, err
	}
	return info.Size, nil
}

// List returns the names under prefix, sorted.
func (s *S3Store) List(ctx context.Context, prefix string) ([]string, error) {
	var names []string
	after := ""
	err := s.retry(ctx, "list", prefix, s.prefix+prefix, func(ctx context.Context) error {
		// A retry resumes after the last name already listed.
		for obj := range s.core.Client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{
			Prefix:     s.prefix + prefix,
			Recursive:  true,
			StartAfter: after,
		}) {
			if obj.Err != nil {
				return obj.Err
			}
			names = append(names, strings.TrimPrefix(obj.Key, s.prefix))
			after = obj.Key
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

// Delete removes the object; a missing one is not an error.
func (s *S3Store) Delete(ctx context.Context, name string) error {
	key, err := s.key(name)
	if err != nil {
		return err
	}
	return s.retry(ctx, "delete", name, key, func(ctx context.Context) error {
		err := s.core.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{})
		if s3Code(err) == minio.NoSuchKey {
			return nil
		}
		return err
	})
}
