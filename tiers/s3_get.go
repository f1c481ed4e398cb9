package tiers

// Reading an object back: Parallel ranges at a time, pinned to the ETag
// the object had when the Get began, checked against the whole-object
// CRC32C the server stored (see S3Store).

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"

	"github.com/minio/minio-go/v7"
	"rewind.dev/rewind/shm"
)

// Get writes the object into dst; see S3Store.
//
// An object replaced while it is read (a concurrent Put of the name
// completed) is read again from the start, the new version whole: Store
// allows Puts and Gets of one name at once, and a replacement is not a
// failure of the Get. The reads are bounded as a failed request's
// attempts are, by MaxAttempts and RetryTimeout, with the same jittered
// backoff between them, which lets a burst of writers finish; an object
// replaced faster than that for longer gives up with an S3Error saying
// how many reads were made.
func (s *S3Store) Get(ctx context.Context, name string, dst io.WriterAt) (int64, error) {
	key, err := s.key(name)
	if err != nil {
		return 0, err
	}
	start := s.cfg.Clock.Now()
	for reads := 1; ; reads++ {
		n, err := s.getOnce(ctx, name, key, dst)
		if !errors.Is(err, errS3Changed) {
			return n, err
		}
		elapsed := s.cfg.Clock.Now().Sub(start)
		wait, ok := s.retrier.again(reads, elapsed)
		if !ok {
			return 0, &S3Error{Op: "get", Endpoint: s.endpoint, Bucket: s.bucket, Key: key, Attempts: reads, Elapsed: elapsed, Err: errS3Changed}
		}
		s.cfg.Logger.Info("tiers: s3 object replaced while it was read; reading the new version", "name", name,
			"reads", reads, "wait", wait)
		if err := s.retrier.sleep(ctx, wait); err != nil {
			return 0, &S3Error{Op: "get", Endpoint: s.endpoint, Bucket: s.bucket, Key: key, Attempts: reads, Elapsed: elapsed, Err: err}
		}
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
