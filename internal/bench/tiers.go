package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"rewind.dev/rewind/tiers"
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
		if err := st.Put(ctx, name, bytes.NewReader(src), cfg.Size); err != nil {
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

// PrintFileTier writes the result.
func PrintFileTier(w io.Writer, r FileTierResult) {
	fmt.Fprintf(w, "%-10s %14s %14s %8s\n", "size", "dd direct", "nvme tier", "ratio")
	fmt.Fprintf(w, "%-10d %14s %14s %8.2f\n", r.Size, gbps(r.DD), gbps(r.Store), r.Store/r.DD)
}
