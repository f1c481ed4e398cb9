package bench

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"rewind.dev/rewind/internal/miniotest"
	"rewind.dev/rewind/tiers"
)

// TestS3BenchRuns: the S3 benchmark's plumbing, small; every figure is
// positive. Its figures come from `make bench`.
func TestS3BenchRuns(t *testing.T) {
	srv := miniotest.Start(t)
	cfg := tiers.DefaultS3Config()
	cfg.URL = "s3://" + srv.Bucket + "/bench"
	cfg.Endpoint = srv.URL()
	cfg.AccessKey, cfg.SecretKey = tiers.Secret(srv.AccessKey), tiers.Secret(srv.SecretKey)
	cfg.PartSize = 5 << 20 // the S3 minimum
	r, err := S3(t.Context(), cfg, S3Options{Size: 4*cfg.PartSize + 3, Runs: 1})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	PrintS3(&out, r)
	t.Log("\n" + out.String())
	if r.Put <= 0 || r.Get <= 0 || r.MinioPut <= 0 || r.MinioGet <= 0 {
		t.Fatalf("a figure is missing: %+v", r)
	}
}

// BenchmarkS3 reports the store's Put and Get throughput beside a single
// minio-go PutObject and GetObject of the same bytes to the same MinIO:
//
//	REWIND_S3_BENCH_BYTES=1073741824 go test ./internal/bench -run '^$' -bench S3 -benchtime 1x
func BenchmarkS3(b *testing.B) {
	srv := miniotest.Start(b)
	cfg := tiers.DefaultS3Config()
	cfg.URL = "s3://" + srv.Bucket + "/bench"
	cfg.Endpoint = srv.URL()
	cfg.AccessKey, cfg.SecretKey = tiers.Secret(srv.AccessKey), tiers.Secret(srv.SecretKey)
	size := int64(1 << 30)
	if v := os.Getenv("REWIND_S3_BENCH_BYTES"); v != "" {
		if _, err := fmt.Sscan(v, &size); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		r, err := S3(b.Context(), cfg, S3Options{Size: size, Runs: 3})
		if err != nil {
			b.Fatal(err)
		}
		var out bytes.Buffer
		PrintS3(&out, r)
		b.Log("\n" + out.String())
		b.ReportMetric(r.Put/1e6, "put-MB/s")
		b.ReportMetric(r.Get/1e6, "get-MB/s")
		b.ReportMetric(r.MinioPut/1e6, "minio-put-MB/s")
		b.ReportMetric(r.MinioGet/1e6, "minio-get-MB/s")
	}
}
