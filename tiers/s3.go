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
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/shm"
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
// CRC32C the server stored.
//
// Each request (a part, a range, a stat) is retried on transient failures
// (5xx, throttling, refused or reset connections, timeouts) with jittered
// exponential backoff, bounded by MaxAttempts and RetryTimeout; a Put whose
// requests cannot get through fails and aborts its multipart upload, so no
// partial object is ever visible and an earlier object of the name is
// untouched: S3 replaces an object only when an upload completes.
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

// s3CombineCRC returns the CRC32C of the concatenation of pieces with the
// given CRCs and sizes.
func s3CombineCRC(crcs []uint32, sizes []int64) (string, error) {
	parts := make([]minio.ObjectPart, 0, len(crcs))
	for i := range crcs {
		parts = append(parts, minio.ObjectPart{PartNumber: i + 1, Size: sizes[i], ChecksumCRC32C: s3CRCString(crcs[i])})
	}
	if len(parts) == 0 {
		return s3CRCString(0), nil
	}
	c, err := minio.ChecksumFullObjectCRC32C.FullObjectChecksum(parts)
	if err != nil {
		return "", err
	}
	return c.Encoded(), nil
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

func (s *S3Store) putMultipart(ctx context.Context, name, key string, src io.ReaderAt, size int64) (err error) {
	var uploadID string
	err = s.retry(ctx, "put", name, key, func(ctx context.Context) (err error) {
		uploadID, err = s.core.NewMultipartUpload(ctx, s.bucket, key, minio.PutObjectOptions{
			UserMetadata: map[string]string{amzChecksumAlgo: "CRC32C", amzChecksumType: "FULL_OBJECT"},
		})
		return err
	})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			s.abort(ctx, name, key, uploadID)
		}
	}()

	ps := s.cfg.PartSize
	if size > ps*s3MaxParts { // S3 allows 10,000 parts: grow them, in whole MiB
		ps = ((size+s3MaxParts-1)/s3MaxParts + 1<<20 - 1) &^ (1<<20 - 1)
	}
	n := int((size + ps - 1) / ps)
	parts := make([]minio.CompletePart, n)
	crcs := make([]uint32, n)
	sizes := make([]int64, n)
	err = parallel(ctx, s.cfg.Parallel, int64(n), noState, func(pctx context.Context, _ struct{}, i int64) error {
		if pctx.Err() != nil {
			return nil // cancelled: reported below
		}
		off := i * ps
		l := min(ps, size-off)
		c, etag, err := s.putPart(pctx, name, key, uploadID, int(i)+1, src, off, l)
		if err != nil {
			return err
		}
		crcs[i], sizes[i] = c, l
		parts[i] = minio.CompletePart{PartNumber: int(i) + 1, ETag: etag, ChecksumCRC32C: s3CRCString(c)}
		return nil
	})
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return &S3Error{Op: "put", Endpoint: s.endpoint, Bucket: s.bucket, Key: key, Err: context.Cause(ctx)}
	}

	full, err := s3CombineCRC(crcs, sizes)
	if err != nil {
		return &S3Error{Op: "put", Endpoint: s.endpoint, Bucket: s.bucket, Key: key, Err: err}
	}
	attempt := 0
	return s.retry(ctx, "put", name, key, func(actx context.Context) error {
		attempt++
		_, err := s.core.CompleteMultipartUpload(actx, s.bucket, key, uploadID, parts, minio.PutObjectOptions{
			UserMetadata: map[string]string{amzChecksumCRC32C: full, amzChecksumType: "FULL_OBJECT"},
		})
		if err != nil && attempt > 1 && s3Code(err) == "NoSuchUpload" {
			// An earlier attempt completed the upload and its reply was
			// lost: the object is ours if it has our size and checksum.
			info, serr := s.core.StatObject(actx, s.bucket, key, minio.StatObjectOptions{Checksum: true})
			if serr == nil && info.Size == size && info.ChecksumCRC32C == full {
				return nil
			}
		}
		return err
	})
}

// putPart uploads one part, returning its CRC32C and ETag.
func (s *S3Store) putPart(ctx context.Context, name, key, uploadID string, num int, src io.ReaderAt, off, l int64) (uint32, string, error) {
	c, body, err := s3Source(src, off, l)
	if err != nil {
		return 0, "", &S3Error{Op: "put", Endpoint: s.endpoint, Bucket: s.bucket, Key: key, Err: err}
	}
	sum := s3CRCString(c)
	var etag string
	err = s.retry(ctx, "put", name, key, func(ctx context.Context) error {
		b := &s3Body{r: body()}
		p, err := s.core.PutObjectPart(ctx, s.bucket, key, uploadID, num, b, l, minio.PutObjectPartOptions{
			CustomHeader:         http.Header{http.CanonicalHeaderKey(amzChecksumCRC32C): {sum}},
			DisableContentSha256: true,
		})
		etag = p.ETag
		return b.end(err)
	})
	if err != nil {
		return 0, "", fmt.Errorf("%w (part %d at offset %d)", err, num, off)
	}
	return c, etag, nil
}

// abort discards a failed multipart upload and the parts it holds. It runs
// even when ctx is cancelled (that is often why the upload failed), with a
// short bound of its own (one request's, at most 10 s); an upload it
// cannot abort is invisible and is left for the bucket's lifecycle rule
// (AbortIncompleteMultipartUpload).
func (s *S3Store) abort(ctx context.Context, name, key, uploadID string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(s.cfg.RequestTimeout, 10*time.Second))
	defer cancel()
	if err := s.core.AbortMultipartUpload(actx, s.bucket, key, uploadID); err != nil && s3Code(err) != "NoSuchUpload" {
		s.cfg.Logger.Warn("tiers: s3 abort of a failed multipart upload failed; the bucket's lifecycle rule must clean it up",
			"store", s.String(), "name", name, "err", err)
	}
}

// Get writes the object into dst; see S3Store.
func (s *S3Store) Get(ctx context.Context, name string, dst io.WriterAt) (int64, error) {
	key, err := s.key(name)
	if err != nil {
		return 0, err
	}
	for try := 1; ; try++ {
		n, err := s.getOnce(ctx, name, key, dst)
		if errors.Is(err, errS3Changed) && try < 3 {
			continue // replaced by a concurrent Put: read the new one whole
		}
		return n, err
	}
}

func (s *S3Store) stat(ctx context.Context, op, name, key string) (minio.ObjectInfo, error) {
	var info minio.ObjectInfo
	err := s.retry(ctx, op, name, key, func(ctx context.Context) (err error) {
		info, err = s.core.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{Checksum: true})
		return err
	})
	return info, err
}

func (s *S3Store) getOnce(ctx context.Context, name, key string, dst io.WriterAt) (int64, error) {
	info, err := s.stat(ctx, "get", name, key)
	if err != nil {
		return 0, err
	}
	size := info.Size
	if size == 0 {
		return 0, nil
	}
	ps := s.cfg.PartSize
	n := int((size + ps - 1) / ps)
	crcs := make([]uint32, n)
	sizes := make([]int64, n)
	err = parallel(ctx, s.cfg.Parallel, int64(n), noState, func(pctx context.Context, _ struct{}, i int64) error {
		if pctx.Err() != nil {
			return nil // cancelled: reported below
		}
		off := i * ps
		l := min(ps, size-off)
		var c uint32
		err := s.retry(pctx, "get", name, key, func(ctx context.Context) (err error) {
			c, err = s.getRange(ctx, key, info.ETag, dst, off, l)
			return err
		})
		if err != nil {
			return err
		}
		crcs[i], sizes[i] = c, l
		return nil
	})
	if err != nil {
		return 0, err
	}
	if ctx.Err() != nil {
		return 0, &S3Error{Op: "get", Endpoint: s.endpoint, Bucket: s.bucket, Key: key, Err: context.Cause(ctx)}
	}
	if want := fullObjectCRC32C(info); want != "" {
		got, err := s3CombineCRC(crcs, sizes)
		if err == nil && got != want {
			err = fmt.Errorf("%w: checksum mismatch: the server stored CRC32C %s, the bytes read have %s", shm.ErrCorrupt, want, got)
		}
		if err != nil {
			return 0, &S3Error{Op: "get", Endpoint: s.endpoint, Bucket: s.bucket, Key: key, Err: err}
		}
	}
	return size, nil
}

// fullObjectCRC32C returns the object's whole-content CRC32C, or "" when
// the server has none (an object written without one, or a COMPOSITE
// checksum of part checksums).
func fullObjectCRC32C(info minio.ObjectInfo) string {
	c := info.ChecksumCRC32C
	if c == "" || strings.Contains(c, "-") || strings.EqualFold(info.ChecksumMode, "COMPOSITE") {
		return ""
	}
	return c
}

// getRange copies bytes [off, off+l) of the object's version etag into dst
// and returns their CRC32C. A destination that hands out its memory
// (SliceWriterAt: a segment mapped for a restore) is read into in place;
// any other gets the bytes through WriteAt from a buffer of ours.
func (s *S3Store) getRange(ctx context.Context, key, etag string, dst io.WriterAt, off, l int64) (uint32, error) {
	var opts minio.GetObjectOptions
	if err := opts.SetRange(off, off+l-1); err != nil {
		return 0, err
	}
	if etag != "" {
		if err := opts.SetMatchETag(etag); err != nil {
			return 0, err
		}
	}
	rc, _, _, err := s.core.GetObject(ctx, s.bucket, key, opts)
	if err != nil {
		if s3Code(err) == "PreconditionFailed" {
			return 0, errS3Changed
		}
		return 0, err
	}
	defer rc.Close()
	if b, err := DestSliceAt(dst, off, int(l)); err == nil {
		return s3ReadInPlace(rc, b, off)
	} else if !errors.Is(err, ErrNoSlice) {
		return 0, &s3SourceError{fmt.Errorf("writing destination at offset %d: %w", off, err)}
	}
	bp := s3CopyBufs.Get().(*[]byte)
	defer s3CopyBufs.Put(bp)
	buf := *bp
	var c uint32
	for done := int64(0); done < l; {
		n, err := io.ReadFull(rc, buf[:min(int64(len(buf)), l-done)])
		if n > 0 {
			if _, werr := dst.WriteAt(buf[:n], off+done); werr != nil {
				return 0, &s3SourceError{fmt.Errorf("writing destination at offset %d: %w", off+done, werr)}
			}
			c = crc32.Update(c, s3Castagnoli, buf[:n])
			done += int64(n)
		}
		if err != nil && done < l {
			return 0, s3ShortRange(err, off+done)
		}
	}
	return c, nil
}

// s3InPlaceChunk is how much of a range is read into the destination
// before its CRC32C is taken: small enough to be in the core's cache
// still, so the checksum costs no second trip through memory.
const s3InPlaceChunk = 256 << 10

// s3ReadInPlace reads body straight into b, the destination's own memory
// for the range at off (no copy through a buffer of ours), and returns the
// CRC32C of what it read.
func s3ReadInPlace(body io.Reader, b []byte, off int64) (uint32, error) {
	var c uint32
	for done := 0; done < len(b); {
		n, err := io.ReadFull(body, b[done:min(done+s3InPlaceChunk, len(b))])
		c = crc32.Update(c, s3Castagnoli, b[done:done+n])
		done += n
		if err != nil && done < len(b) {
			return 0, s3ShortRange(err, off+int64(done))
		}
	}
	return c, nil
}

// s3ShortRange is the error of a range body that ended, or failed, at off
// before its end.
func s3ShortRange(err error, off int64) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("reading range at offset %d: %w", off, err)
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
