package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// CPUResult is how much a CPU-bound loop slows down while one tier
// transfer of a shared-memory segment runs beside it.
type CPUResult struct {
	Tier     string  // "nvme" or "s3"
	Limit    int64   // the transfer's bandwidth limit in bytes per second; 0: none
	Nice     int     // the nice value of the transfer's threads (the loop's is 0)
	Size     int64   // bytes transferred
	Alone    float64 // loop iterations per second without a transfer (median)
	Beside   float64 // loop iterations per second while the transfer runs (median)
	Slowdown float64 // median over the runs of 1 - beside/alone
	Transfer float64 // the transfer's bytes per second (median)
	// The fraction of the time the loop's thread was ready to run but
	// waited for a CPU, alone and beside the transfer (medians): a
	// slowdown that is mostly waiting is CPU time the transfer (or another
	// process) took; the rest is the core running slower (memory, caches).
	WaitAlone, WaitBeside float64
}

// defaultAloneWindow is how long the loop runs alone before and after
// each transfer: the loop's rate alone is the mean of both, so a drift of
// the machine's speed during a run does not pass for a slowdown.
const defaultAloneWindow = time.Second

// cpuTiers measures the slowdown beside a transfer of a cfg.CPUSize segment
// to the NVMe tier, and to S3 when s3cfg is set; each unlimited and, when
// cfg.Bandwidth is set, limited. With place set (a local server) the loop
// runs on a CPU of its own, and the server is kept off it, while the S3
// transfers run.
func cpuTiers(ctx context.Context, cfg TiersConfig, s3cfg *tiers.S3Config, place *placement, logf func(string, ...any)) ([]CPUResult, error) {
	seg, err := newSegment(cfg.ShmDir, cfg.CPUSize)
	if err != nil {
		return nil, err
	}
	defer seg.Close()
	dir, err := os.MkdirTemp(cfg.Dir, "rewind-bench-cpu-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	nvme, err := tiers.NewFileStore(filepath.Join(dir, "store"), tiers.NVMeOptions())
	if err != nil {
		return nil, err
	}
	type target struct {
		name string
		st   tiers.Store
	}
	targets := []target{{"nvme", nvme}}
	if s3cfg != nil {
		st, err := tiers.NewS3Store(*s3cfg)
		if err != nil {
			return nil, err
		}
		targets = append(targets, target{"s3", st})
	}
	limits := []int64{0}
	if cfg.Bandwidth > 0 {
		limits = append(limits, cfg.Bandwidth)
	}
	sp := startSpinner()
	defer sp.stop()
	nices := []int{0}
	if cfg.TransferNice > 0 {
		nices = append(nices, cfg.TransferNice) // raised last: lowering it back needs a privilege
	}
	defer func() { _ = setNiceExcept(sp.tid, 0) }() // where allowed: lowering a nice value needs CAP_SYS_NICE
	var out []CPUResult
	for _, nice := range nices {
		if nice > 0 {
			if err := setNiceExcept(sp.tid, nice); err != nil {
				return out, err
			}
		}
		for _, t := range targets {
			if place != nil && t.name == "s3" {
				if err := place.apply(sp.tid); err != nil {
					return out, err
				}
			}
			for _, limit := range limits {
				logf("cpu slowdown: %s transfer of %s to %s, limit %s, nice %d, %d runs", t.name, units.Bytes(uint64(cfg.CPUSize)), t.st, rateString(limit), nice, cfg.Runs)
				r, err := cpuSlowdown(ctx, sp, t.st, seg.Data, limit, cfg.Runs, cmp.Or(cfg.AloneWindow, defaultAloneWindow), nice)
				if err != nil {
					return out, fmt.Errorf("bench: cpu test, %s: %w", t.name, err)
				}
				r.Tier = t.name
				out = append(out, r)
			}
			if place != nil && t.name == "s3" {
				if err := place.undo(sp.tid); err != nil {
					return out, err
				}
			}
		}
	}
	return out, nil
}

// cpuSlowdown runs the loop alone, then beside a Put of seg to st (limited
// to limit bytes/s when positive), then alone again, runs times. With nice
// positive, every thread but the loop's is set to it again before each
// Put, so that threads the runtime started meanwhile are too.
func cpuSlowdown(ctx context.Context, sp *spinner, st tiers.Store, seg []byte, limit int64, runs int, aloneWindow time.Duration, nice int) (CPUResult, error) {
	res := CPUResult{Limit: limit, Size: int64(len(seg)), Nice: nice}
	var alone, beside, slow, secs, waitAlone, waitBeside []float64
	for run := range runs {
		before, err := sp.measure(ctx, aloneWindow, nil)
		if err != nil {
			return res, err
		}
		if nice > 0 {
			if err := setNiceExcept(sp.tid, nice); err != nil {
				return res, err
			}
		}
		name := fmt.Sprintf("bench-cpu/step-%d/rank-0.safetensors", run)
		src := tiers.LimitReaderAt(ctx, tiers.BytesReaderAt(seg), tiers.NewLimiter(limit, nil)) // as the agent puts it
		with, err := sp.measure(ctx, 0, func() error { return st.Put(ctx, name, src, int64(len(seg))) })
		if err != nil {
			return res, err
		}
		if err := st.Delete(ctx, name); err != nil {
			return res, err
		}
		after, err := sp.measure(ctx, aloneWindow, nil)
		if err != nil {
			return res, err
		}
		a := (before.rate() + after.rate()) / 2
		alone, beside, slow = append(alone, a), append(beside, with.rate()), append(slow, 1-with.rate()/a)
		secs = append(secs, with.wall.Seconds())
		waitAlone = append(waitAlone, (before.waited()+after.waited())/2)
		waitBeside = append(waitBeside, with.waited())
	}
	res.Alone, res.Beside, res.Slowdown = med(alone), med(beside), med(slow)
	res.WaitAlone, res.WaitBeside = med(waitAlone), med(waitBeside)
	res.Transfer = float64(len(seg)) / med(secs)
	return res, nil
}

// spinner is a CPU-bound loop on one goroutine locked to its thread,
// hashing a buffer that stays in the L1 cache, and counting its rounds,
// a stand-in for a training process's busy host thread.
type spinner struct {
	tid    int // the loop's thread
	rounds atomic.Int64
	done   atomic.Bool
	exited chan struct{}
}

// spinWords is the loop's buffer: 32 KiB, the L1 data cache of most cores.
const spinWords = 4096

var spinSink atomic.Uint64 // keeps the compiler from dropping the loop

func startSpinner() *spinner {
	sp := &spinner{exited: make(chan struct{})}
	started := make(chan struct{})
	go func() {
		defer close(sp.exited)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread() // an exiting locked goroutine would take its thread with it
		sp.tid = unix.Gettid()
		buf := make([]uint64, spinWords)
		for i := range buf {
			buf[i] = uint64(i) * 0x9e3779b97f4a7c15
		}
		close(started)
		var h uint64
		for !sp.done.Load() {
			for _, w := range buf {
				h = (h ^ w) * 0x100000001b3
				h ^= h >> 29
			}
			sp.rounds.Add(1)
		}
		spinSink.Store(h)
	}()
	<-started
	return sp
}

// window is what the loop did over a stretch of wall time.
type window struct {
	rounds     int64
	wall, wait time.Duration // wait: runnable, but not running (the kernel's schedstat)
}

func (w window) rate() float64 { return float64(w.rounds) / w.wall.Seconds() }

// waited is the fraction of the window the loop's thread waited for a CPU.
func (w window) waited() float64 { return w.wait.Seconds() / w.wall.Seconds() }

// measure watches the loop for d, or while f runs when f is set.
func (sp *spinner) measure(ctx context.Context, d time.Duration, f func() error) (window, error) {
	n0, w0, t0 := sp.rounds.Load(), sp.waitTime(), time.Now()
	if f != nil {
		if err := f(); err != nil {
			return window{}, err
		}
	} else {
		select {
		case <-ctx.Done():
			return window{}, ctx.Err()
		case <-time.After(d):
		}
	}
	n1, w1, t1 := sp.rounds.Load(), sp.waitTime(), time.Now()
	return window{rounds: n1 - n0, wall: t1.Sub(t0), wait: w1 - w0}, nil
}

// waitTime returns how long the loop's thread has waited to run, from
// /proc/self/task/TID/schedstat; zero where that is not available.
func (sp *spinner) waitTime() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/schedstat", sp.tid))
	if err != nil {
		return 0
	}
	var run, wait int64
	if _, err := fmt.Sscan(string(b), &run, &wait); err != nil {
		return 0
	}
	return time.Duration(wait)
}

func (sp *spinner) stop() {
	sp.done.Store(true)
	<-sp.exited
}

// newSegment makes a shared-memory segment of size bytes in dir, as a
// rank's shard is: space allocated, mapped with every page populated, and
// filled. Its file is removed at once, so the memory goes back to the
// system when the mapping is closed, or when the process ends however it
// ends.
func newSegment(dir string, size int64) (*shm.Mapping, error) {
	f, err := os.CreateTemp(dir, "rewind-bench-cpu-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer f.Close()
	defer os.Remove(f.Name())
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		return nil, fmt.Errorf("bench: allocating a %s segment in %s: %w", units.Bytes(uint64(size)), dir, err)
	}
	m, err := shm.Map(f, size, true)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	pattern := m.Data[:min(size, 8<<20)]
	fill(pattern)
	for off := len(pattern); off < len(m.Data); off += len(pattern) {
		copy(m.Data[off:], pattern)
	}
	return m, nil
}

func rateString(bytesPerSec int64) string {
	if bytesPerSec <= 0 {
		return "none"
	}
	return fmt.Sprintf("%.0f MB/s", float64(bytesPerSec)/1e6)
}
