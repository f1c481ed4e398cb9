package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/minio/minio-go/v7"

	"rewind.dev/rewind/tiers"
)

// S3Options configure S3.
type S3Options struct {
	Size int64 // bytes of the object
	Runs int   // measured runs per figure; the median is reported
}

// S3Result holds throughputs in bytes per second.
type S3Result struct {
	Size, PartSize int64
	Parallel       int
	Put, Get       float64 // this store
	MinioPut       float64 // one minio-go PutObject call, default options (its own 4-way multipart from an io.ReaderAt)
	MinioPut1      float64 // one minio-go PutObject call, one part at a time (NumThreads 1)
	MinioGet       float64 // one minio-go GetObject call read to the end (one stream)
}

// S3 measures the S3 store's Put and Get of one object of opts.Size bytes
// against minio-go's own PutObject and GetObject of the same bytes to the
// same bucket, in the same run. It writes and deletes objects under the
// store's prefix ("bench-*").
func S3(ctx context.Context, cfg tiers.S3Config, opts S3Options) (S3Result, error) {
	if opts.Runs < 1 {
		opts.Runs = 3
	}
	s, err := tiers.NewS3Store(cfg)
	if err != nil {
		return S3Result{}, err
	}
	mc, bucket, prefix, err := s.MinioClient()
	if err != nil {
		return S3Result{}, err
	}
	data := make([]byte, opts.Size)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(data); i += 8 {
		v := r.Uint64()
		data[i], data[i+1], data[i+2], data[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		data[i+4], data[i+5], data[i+6], data[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	dst := &benchBuf{b: make([]byte, opts.Size)}
	clear(dst.b) // fault its pages in now, so that no measured read pays for them
	res := S3Result{Size: opts.Size, PartSize: cfg.PartSize, Parallel: cfg.Parallel}
	const name, mcName, mcName1 = "bench-store", "bench-minio-go", "bench-minio-go-1"
	defer func() {
		for _, n := range []string{name, mcName, mcName1} {
			_ = s.Delete(context.WithoutCancel(ctx), n)
		}
	}()
	putMC := func(key string, threads uint) func() error {
		return func() error {
			_, err := mc.PutObject(ctx, bucket, prefix+key, bytes.NewReader(data), opts.Size, minio.PutObjectOptions{NumThreads: threads})
			return err
		}
	}
	// Each run measures every contender once, one after the other, so a
	// machine whose speed drifts (other work beside the benchmark) slows
	// all of them alike rather than whichever ran during the slow spell.
	puts, err := benchInterleaved(opts.Runs, opts.Size,
		func() error { return s.Put(ctx, name, bytes.NewReader(data), opts.Size) },
		putMC(mcName, 0),
		putMC(mcName1, 1))
	if err != nil {
		return res, err
	}
	res.Put, res.MinioPut, res.MinioPut1 = puts[0], puts[1], puts[2]
	ref := make([]byte, opts.Size) // minio-go's destination, faulted in as dst is
	clear(ref)
	gets, err := benchInterleaved(opts.Runs, opts.Size,
		func() error { _, err := s.Get(ctx, name, dst); return err },
		func() error {
			obj, err := mc.GetObject(ctx, bucket, prefix+mcName, minio.GetObjectOptions{})
			if err != nil {
				return err
			}
			defer obj.Close()
			_, err = io.ReadFull(obj, ref)
			return err
		})
	if err != nil {
		return res, err
	}
	res.Get, res.MinioGet = gets[0], gets[1]
	if !bytes.Equal(dst.b, data) {
		return res, fmt.Errorf("bench: the S3 store's Get returned different bytes")
	}
	if !bytes.Equal(ref, data) {
		return res, fmt.Errorf("bench: minio-go's GetObject returned different bytes")
	}
	return res, nil
}

// benchInterleaved runs each of fs once per run, in turn, runs times, and
// returns each one's median rate of moving size bytes.
func benchInterleaved(runs int, size int64, fs ...func() error) ([]float64, error) {
	rates := make([][]float64, len(fs))
	for range runs {
		for i, f := range fs {
			start := time.Now()
			if err := f(); err != nil {
				return nil, err
			}
			rates[i] = append(rates[i], float64(size)/time.Since(start).Seconds())
		}
	}
	out := make([]float64, len(fs))
	for i, r := range rates {
		slices.Sort(r)
		out[i] = r[len(r)/2]
	}
	return out, nil
}

// PrintS3 writes the figures and the ratios to minio-go's.
func PrintS3(w io.Writer, r S3Result) {
	mbs := func(b float64) string { return fmt.Sprintf("%7.0f MB/s", b/1e6) }
	fmt.Fprintf(w, "S3 tier, %d MiB object, %d MiB parts, %d in parallel (median)\n", r.Size>>20, r.PartSize>>20, r.Parallel)
	fmt.Fprintf(w, "  upload:   store %s   minio-go PutObject %s (x%.2f)   one stream %s (x%.2f)\n",
		mbs(r.Put), mbs(r.MinioPut), r.Put/r.MinioPut, mbs(r.MinioPut1), r.Put/r.MinioPut1)
	fmt.Fprintf(w, "  download: store %s   minio-go GetObject %s (x%.2f)\n", mbs(r.Get), mbs(r.MinioGet), r.Get/r.MinioGet)
}

// benchBuf is an io.WriterAt over fixed memory, which it hands out to be
// written in place (a SliceWriterAt), as a segment mapped for a restore is.
type benchBuf struct{ b []byte }

func (w *benchBuf) SliceAt(off int64, n int) ([]byte, error) {
	if off < 0 || n < 0 || off+int64(n) > int64(len(w.b)) {
		return nil, io.ErrShortWrite
	}
	return w.b[off : off+int64(n) : off+int64(n)], nil
}

func (w *benchBuf) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(w.b)) {
		return 0, io.ErrShortWrite
	}
	return copy(w.b[off:], p), nil
}
