package bench

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/internal/miniotest"
	"rewind.dev/rewind/tiers"
)

// smallTiers is the tiers benchmark at sizes a test can afford.
func smallTiers(t *testing.T) TiersConfig {
	s3 := tiers.DefaultS3Config()
	s3.Endpoint, s3.PartSize = "", 5<<20
	shmDir, err := os.MkdirTemp("/dev/shm", "rewind-bench-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shmDir) })
	return TiersConfig{Dir: t.TempDir(), ShmDir: shmDir, Size: 16 << 20, CPUSize: 12 << 20, Runs: 1, Chunk: 1 << 20,
		Bandwidth: 64e6, TransferNice: 5, AloneWindow: 50 * time.Millisecond, S3: s3}
}

// TestTiersBenchRuns: one run measures every figure (a local MinIO
// included), prints them, and leaves nothing behind.
func TestTiersBenchRuns(t *testing.T) {
	miniotest.Require(t)
	cfg := smallTiers(t)
	r, err := Tiers(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.File.DD <= 0 || r.File.Store <= 0 || r.S3 == nil || r.S3.Put <= 0 || r.S3.MinioGet <= 0 {
		t.Fatalf("a throughput figure is missing: %+v, s3 %+v", r.File, r.S3)
	}
	want := []string{"nvme put", "nvme put, limit 64 MB/s", "s3 put", "s3 put, limit 64 MB/s",
		"nvme put, nice 5", "nvme put, limit 64 MB/s, nice 5", "s3 put, nice 5", "s3 put, limit 64 MB/s, nice 5"}
	if len(r.CPU) != len(want) {
		t.Fatalf("%d cpu results, want %d: %+v", len(r.CPU), len(want), r.CPU)
	}
	for i, c := range r.CPU {
		if err := saneCPU(c, cfg.CPUSize); cpuName(c) != want[i] || err != nil {
			t.Errorf("cpu result %d = %+v (%s), want %s: %v", i, c, cpuName(c), want[i], err)
		}
	}
	// Sixteen alone windows with not one round is a loop that does not
	// run, or rounds that are not counted, however loaded the machine.
	if !slices.ContainsFunc(r.CPU, func(c CPUResult) bool { return c.Alone > 0 }) {
		t.Errorf("the loop made no round in any window of the cpu test: %+v", r.CPU)
	}
	if runtime.NumCPU() > 1 && !strings.Contains(r.CPUPlacement, "the local MinIO (pid") {
		t.Errorf("cpu placement %q: want the loop and the local MinIO on CPUs of their own", r.CPUPlacement)
	}
	var out strings.Builder
	PrintTiers(&out, r)
	t.Log("\n" + out.String())
	for _, s := range []string{"nvme write 16.0 MiB", "dd oflag=direct", "s3 upload", "minio-go GetObject", "cpu loop beside s3 put, limit 64 MB/s", "local MinIO"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("the table lacks %q", s)
		}
	}
	assertEmpty(t, cfg.Dir)
	assertEmpty(t, cfg.ShmDir)
}

// saneCPU checks what a CPU result must be on any machine, not how fast
// anything ran: the loop's rates are rounds counted over wall time, and
// on a loaded machine (two cores, the race detector, other tests) its
// thread may not run at all during a short transfer or an alone window,
// so zero rounds is a measurement, not a fault. The slowdown is only
// defined when the loop ran alone.
func saneCPU(c CPUResult, size int64) error {
	measured := func(xs ...float64) bool { // a rate or a fraction
		for _, x := range xs {
			if math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
				return false
			}
		}
		return true
	}
	switch {
	case c.Size != size:
		return fmt.Errorf("size %d, want %d", c.Size, size)
	case !measured(c.Transfer) || c.Transfer == 0:
		return fmt.Errorf("transfer rate %v, want a positive rate", c.Transfer)
	case !measured(c.Alone, c.Beside, c.WaitAlone, c.WaitBeside):
		return fmt.Errorf("loop rates %v, %v or waits %v, %v not finite and non-negative", c.Alone, c.Beside, c.WaitAlone, c.WaitBeside)
	case c.Alone > 0 && (math.IsNaN(c.Slowdown) || c.Slowdown > 1):
		return fmt.Errorf("slowdown %v, want at most 1 (1 - beside/alone)", c.Slowdown)
	}
	return nil
}

// TestTiersBenchWithoutMinIO: a missing MinIO binary skips the S3 figures
// and says how to build it.
func TestTiersBenchWithoutMinIO(t *testing.T) {
	t.Setenv(miniotest.EnvBinary, "/nonexistent/minio")
	cfg := smallTiers(t)
	cfg.CPUSize = 0
	r, err := Tiers(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.S3 != nil || len(r.CPU) != 0 || !strings.Contains(r.S3Note, "skipped") {
		t.Fatalf("s3 %+v, cpu %+v, note %q: want S3 skipped and no CPU test", r.S3, r.CPU, r.S3Note)
	}
	var out strings.Builder
	PrintTiers(&out, r)
	if !strings.Contains(out.String(), "skipped") || !strings.Contains(out.String(), miniotest.EnvBinary) {
		t.Fatalf("the table does not say why S3 was skipped:\n%s", out.String())
	}
}

func TestTiersBenchChecksSpace(t *testing.T) {
	cfg := smallTiers(t)
	cfg.NoS3, cfg.CPUSize = true, 1<<50
	if _, err := Tiers(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "free") {
		t.Fatalf("a segment larger than the disk: %v, want an error saying what is free", err)
	}
	assertEmpty(t, cfg.Dir)
}

func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	left, err := os.ReadDir(dir)
	if err != nil || len(left) != 0 {
		t.Fatalf("left behind in %s: %v %v", dir, left, err)
	}
}
