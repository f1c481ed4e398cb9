package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"rewind.dev/rewind/internal/miniotest"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/tiers"
	"rewind.dev/rewind/vfs"
)

// FileTierConfig configures the file-tier benchmark.
type FileTierConfig struct {
	Dir   string // a directory on the disk to measure
	Size  int64
	Runs  int
	Chunk int64 // dd block size and store chunk
}

// FileTierResult is bytes per second, medians.
type FileTierResult struct {
	Size  int64
	DD    float64 // dd oflag=direct conv=fsync, the same size, the same directory
	Store float64 // FileStore.Put with NVMe options (fsync and rename included)
}

// FileTier measures the NVMe tier's write throughput against dd writing
// the same bytes with O_DIRECT to the same directory, in one run.
func FileTier(ctx context.Context, cfg FileTierConfig) (FileTierResult, error) {
	res := FileTierResult{Size: cfg.Size}
	if cfg.Runs < 1 {
		cfg.Runs = 3
	}
	dir, err := os.MkdirTemp(cfg.Dir, "rewind-bench-tier-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	src := make([]byte, cfg.Size)
	fill(src)
	opts := tiers.NVMeOptions()
	st, err := tiers.NewFileStore(filepath.Join(dir, "store"), opts)
	if err != nil {
		return res, err
	}
	var dd, put []float64
	for run := range cfg.Runs {
		t, err := runDD(ctx, filepath.Join(dir, "dd.out"), cfg.Size, cfg.Chunk)
		if err != nil {
			return res, err
		}
		dd = append(dd, t)
		name := fmt.Sprintf("job/step-%d/rank-0.safetensors", run)
		t0 := time.Now()
		if err := st.Put(ctx, name, tiers.BytesReaderAt(src), cfg.Size); err != nil { // as the agent puts a mapped segment
			return res, err
		}
		put = append(put, time.Since(t0).Seconds())
		if err := st.Delete(ctx, name); err != nil {
			return res, err
		}
	}
	res.DD, res.Store = float64(cfg.Size)/med(dd), float64(cfg.Size)/med(put)
	return res, nil
}

// runDD writes size bytes of zeros with dd oflag=direct conv=fsync and
// returns the seconds it took.
func runDD(ctx context.Context, path string, size, bs int64) (float64, error) {
	defer os.Remove(path)
	cmd := exec.CommandContext(ctx, "dd", "if=/dev/zero", "of="+path, "bs="+strconv.FormatInt(bs, 10),
		"count="+strconv.FormatInt(size/bs, 10), "oflag=direct", "conv=fsync", "status=none")
	cmd.Stderr = io.Discard
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("bench: dd: %w", err)
	}
	return time.Since(t0).Seconds(), nil
}

// TiersConfig configures the tiers benchmark: the NVMe tier against dd,
// the S3 store against minio-go, and how much a CPU-bound loop slows down
// while a tier transfer runs beside it, all in one run.
type TiersConfig struct {
	Dir     string // the NVMe tier's disk: the file store writes here, and a local MinIO keeps its data here
	ShmDir  string // the tmpfs the CPU test's segment lives in
	Size    int64  // bytes per write of the throughput figures
	CPUSize int64  // bytes of the segment the CPU test transfers; 0 skips the CPU test
	Runs    int    // runs per figure; medians are reported
	Chunk   int64  // dd's block size
	// Bandwidth, when positive, also runs the CPU test with the transfer
	// limited to this many bytes per second (tiers.Limiter).
	Bandwidth int64
	// TransferNice, when positive, also runs the CPU test with every
	// thread of the benchmark but the loop's at this nice value, as an
	// agent run under `nice -n TransferNice` beside a training process.
	TransferNice int
	// AloneWindow is how long the loop runs alone before and after each
	// transfer (0: a second).
	AloneWindow time.Duration
	// S3 is the object store to measure: DefaultS3Config() with the
	// caller's settings. With an empty Endpoint a local MinIO server
	// (bin/minio) is started for the run, its data under Dir; when the
	// binary is missing, the S3 figures are skipped and TiersResult.S3Note
	// says why.
	S3   tiers.S3Config
	NoS3 bool
	Log  io.Writer // progress lines; nil discards them
}

// TiersResult holds the figures; bandwidths in bytes per second.
type TiersResult struct {
	File   FileTierResult
	S3     *S3Result // nil when skipped
	S3Note string    // where the S3 figures come from, or why they are missing
	CPU    []CPUResult
	// CPUPlacement says which CPUs the loop and a local server were
	// confined to in the CPU test; "" when they were not.
	CPUPlacement string
}

// Tiers runs the tiers benchmark.
func Tiers(ctx context.Context, cfg TiersConfig) (TiersResult, error) {
	var res TiersResult
	if cfg.Runs < 1 {
		cfg.Runs = 3
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	if err := checkSpace(cfg, !cfg.NoS3 && cfg.S3.Endpoint == ""); err != nil {
		return res, err
	}
	s3, err := s3Target(cfg)
	if err != nil {
		return res, err
	}
	defer s3.stop()
	s3cfg := s3.cfg
	res.S3Note = s3.note

	logf("nvme tier: %s writes against dd, %d runs", units.Bytes(uint64(cfg.Size)), cfg.Runs)
	if res.File, err = FileTier(ctx, FileTierConfig{Dir: cfg.Dir, Size: cfg.Size, Runs: cfg.Runs, Chunk: cfg.Chunk}); err != nil {
		return res, err
	}
	if s3cfg != nil {
		logf("s3 tier: %s uploads and downloads against minio-go, %d runs", units.Bytes(uint64(cfg.Size)), cfg.Runs)
		r, err := S3(ctx, *s3cfg, S3Options{Size: cfg.Size, Runs: cfg.Runs})
		if err != nil {
			return res, fmt.Errorf("bench: s3: %w", err)
		}
		res.S3 = &r
	}
	if cfg.CPUSize > 0 {
		var place *placement
		if s3.localPID != 0 {
			if place, err = placeLocalServer(s3.localPID); err != nil {
				return res, err
			}
			res.CPUPlacement = place.String()
		}
		if res.CPU, err = cpuTiers(ctx, cfg, s3cfg, place, logf); err != nil {
			return res, err
		}
	}
	return res, nil
}

// s3Setup is the object store to measure.
type s3Setup struct {
	cfg      *tiers.S3Config // nil: skip it
	stop     func()          // stops a local server
	note     string          // for the table
	localPID int             // the process of a server the benchmark started; 0 for none
}

// s3Target returns the object store to measure, starting a local server
// when no endpoint is given.
func s3Target(cfg TiersConfig) (s3Setup, error) {
	nop := func() {}
	if cfg.NoS3 {
		return s3Setup{stop: nop, note: "skipped (--no-s3)"}, nil
	}
	c := cfg.S3
	if c.Endpoint != "" {
		if c.URL == "" {
			return s3Setup{stop: nop}, errors.New("bench: an S3 endpoint needs a URL (s3://bucket/prefix) to write under")
		}
		return s3Setup{cfg: &c, stop: nop, note: "at " + c.Endpoint}, nil
	}
	if _, err := miniotest.Binary(); err != nil {
		return s3Setup{stop: nop, note: "skipped: no local MinIO server: " + err.Error()}, nil
	}
	srv, err := miniotest.Launch(cfg.Dir)
	if err != nil {
		return s3Setup{stop: nop}, fmt.Errorf("bench: starting a local MinIO: %w", err)
	}
	c.URL = "s3://" + srv.Bucket + "/bench"
	c.Endpoint, c.Secure, c.Region = srv.URL(), false, miniotest.Region
	c.AccessKey, c.SecretKey, c.SessionToken = tiers.Secret(srv.AccessKey), tiers.Secret(srv.SecretKey), ""
	c.CredentialsFile = ""
	return s3Setup{
		cfg:      &c,
		stop:     func() { _ = srv.Close() },
		note:     "local MinIO (bin/minio) on this machine, data in " + cfg.Dir,
		localPID: srv.PID(),
	}, nil
}

// checkSpace fails early, and clearly, when the segment or the files the
// benchmark writes cannot fit.
func checkSpace(cfg TiersConfig, localS3 bool) error {
	need := max(cfg.Size, cfg.CPUSize)
	if localS3 {
		// S3 keeps three objects at once; MinIO may still hold a
		// deleted object while the next is written.
		need += max(3*cfg.Size, 2*cfg.CPUSize)
	}
	if err := checkFree(cfg.Dir, need, "--dir"); err != nil {
		return err
	}
	if cfg.CPUSize > 0 {
		return checkFree(cfg.ShmDir, cfg.CPUSize, "--shm-dir (or a smaller --cpu-size)")
	}
	return nil
}

func checkFree(dir string, need int64, hint string) error {
	st, err := vfs.Default.Statfs(dir)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if st.Free < uint64(need) {
		return fmt.Errorf("bench: %s has %s free, the benchmark needs %s there: choose another %s",
			dir, units.Bytes(st.Free), units.Bytes(uint64(need)), hint)
	}
	return nil
}

// The targets.
const (
	targetFileVsDD    = 0.9  // the NVMe tier writes at 0.9 of dd oflag=direct or better
	targetS3VsMinio   = 1.5  // the S3 store moves 1.5x a single minio-go stream or better
	targetCPUSlowdown = 0.10 // a transfer slows a CPU-bound loop beside it by less than 10%
)

// PrintTiers writes every figure beside its reference, the ratio and the
// target, then how the CPU test's transfers went.
func PrintTiers(w io.Writer, r TiersResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tmeasured\treference\tratio\ttarget\tmet")
	size := units.Bytes(uint64(r.File.Size))
	row := func(name, measured, ref string, x, target float64) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t>= %.2f\t%s\n", name, measured, ref, x, target, yesNo(x >= target))
	}
	row("nvme write "+size, rate(r.File.Store), "dd oflag=direct "+rate(r.File.DD), r.File.Store/r.File.DD, targetFileVsDD)
	if s := r.S3; s != nil {
		row("s3 upload "+size, rate(s.Put), "minio-go PutObject, 1 part at a time "+rate(s.MinioPut1), s.Put/s.MinioPut1, targetS3VsMinio)
		fmt.Fprintf(tw, "\t\tminio-go PutObject, 4 parts at once %s\t%.2f\t\t\n", rate(s.MinioPut), s.Put/s.MinioPut)
		row("s3 download "+size, rate(s.Get), "minio-go GetObject "+rate(s.MinioGet), s.Get/s.MinioGet, targetS3VsMinio)
	} else {
		fmt.Fprintln(tw, "s3 upload, download\tskipped\t\t\t\t")
	}
	for _, c := range r.CPU {
		fmt.Fprintf(tw, "cpu loop beside %s\t%.0fk rounds/s\talone %.0fk rounds/s\t%.1f%% slower\t< %.0f%%\t%s\n",
			cpuName(c), c.Beside/1e3, c.Alone/1e3, 100*c.Slowdown, 100*targetCPUSlowdown, yesNo(c.Slowdown < targetCPUSlowdown))
	}
	tw.Flush()
	if r.S3Note != "" {
		fmt.Fprintln(w, "s3:", r.S3Note)
	}
	if len(r.CPU) > 0 {
		fmt.Fprintf(w, "cpu: each transfer a Put of a %s shared-memory segment; the loop's thread waited for a CPU:\n", units.Bytes(uint64(r.CPU[0].Size)))
		for _, c := range r.CPU {
			fmt.Fprintf(w, "  %-24s transfer %9s   waited %4.1f%% of the time (alone %.1f%%)\n", cpuName(c), rate(c.Transfer), 100*c.WaitBeside, 100*c.WaitAlone)
		}
		if r.CPUPlacement != "" {
			fmt.Fprintln(w, "cpu placement:", r.CPUPlacement)
		}
	}
}

func cpuName(c CPUResult) string {
	name := c.Tier + " put"
	if c.Limit > 0 {
		name += ", limit " + rateString(c.Limit)
	}
	if c.Nice != 0 {
		name += fmt.Sprintf(", nice %d", c.Nice)
	}
	return name
}

// rate formats bytes per second.
func rate(b float64) string {
	if b >= 1e9 {
		return fmt.Sprintf("%.2f GB/s", b/1e9)
	}
	return fmt.Sprintf("%.0f MB/s", b/1e6)
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "NO"
}
