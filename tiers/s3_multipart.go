package tiers

// Multipart uploads: an object larger than one part goes up as parts of
// PartSize, Parallel at a time, each with its CRC32C, and is completed
// with the CRC32C of the whole object (see S3Store).

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/minio/minio-go/v7"
)

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
// even when ctx is cancelled (that is often why the upload failed), with
// a bound of its own, abortTimeout in all; a request of it that fails or
// hangs (each is given a third of that at most) is retried like any other
// (the upload's own failure is often the store's or the network's, and the
// abort meets the same trouble). An upload it cannot abort is invisible
// and is left for the bucket's lifecycle rule
// (AbortIncompleteMultipartUpload).
func (s *S3Store) abort(ctx context.Context, name, key, uploadID string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	err := s.retry(actx, "abort", name, key, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, abortTimeout/3)
		defer cancel()
		err := s.core.AbortMultipartUpload(ctx, s.bucket, key, uploadID)
		if s3Code(err) == "NoSuchUpload" { // gone: an earlier try's answer was lost
			return nil
		}
		return err
	})
	if err != nil {
		s.cfg.Logger.Warn("tiers: s3 abort of a failed multipart upload failed; the bucket's lifecycle rule must clean it up",
			"store", s.String(), "name", name, "err", err)
	}
}

// abortTimeout bounds the abort of a failed multipart upload, its retries
// included: the caller of the failed Put, cancelled or not, waits for it.
const abortTimeout = 10 * time.Second
