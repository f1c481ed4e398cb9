// Package bench measures rewind's performance claims, each against a
// physical limit measured in the same run (memcpy bandwidth for saves).
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// SaveConfig configures the save benchmark.
type SaveConfig struct {
	Sizes   []uint64 // bytes of state per rank
	Tensors int      // state is split into this many F32 tensors
	Runs    int      // measured runs per figure; the median is reported
	Workers int      // copy/checksum goroutines (0: shm.DefaultWorkers)
	ShmDir  string   // parent of the temporary shm root (a tmpfs)
	Out     io.Writer
}

// SaveResult is the figures for one size; bandwidths in bytes per second.
type SaveResult struct {
	Size           uint64
	Memcpy         float64 // one thread, into pre-faulted memory
	MemcpyParallel float64 // Workers threads, into pre-faulted memory
	SaveCold       float64 // first save into new segments
	SaveWarm       float64 // save into a segment reused from earlier steps
	WarmSeconds    float64 // median blocking time of a warm save
	ColdSeconds    float64
	// Medians of each warm save's bandwidth over the memcpy's measured
	// right before it (one thread, Workers threads).
	WarmToMemcpy, WarmToMemcpyParallel float64
}

// Save runs the save benchmark: Save's blocking time for each size, warm
// and cold, beside a plain memcpy of the same bytes measured in the same run.
func Save(ctx context.Context, cfg SaveConfig) ([]SaveResult, error) {
	if cfg.Runs < 1 {
		cfg.Runs = 5
	}
	if cfg.Workers <= 0 {
		cfg.Workers = shm.DefaultWorkers()
	}
	root, err := os.MkdirTemp(cfg.ShmDir, "rewind-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	acfg := agent.DefaultConfig()
	acfg.Node, acfg.ShmRoot, acfg.Socket = "bench", filepath.Join(root, "shm"), filepath.Join(root, "agent.sock")
	acfg.ListenAddr, acfg.MetricsAddr = "", ""
	acfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	// Jobs isolated, as a cluster runs them: every call carries the job's
	// token and is checked for it; segments come as file descriptors.
	if acfg.JobKeys, err = jobtoken.Parse([]byte(jobtoken.Generate()), "bench"); err != nil {
		return nil, err
	}
	a, err := agent.New(acfg)
	if err != nil {
		return nil, err
	}
	actx, stop := context.WithCancel(ctx)
	defer stop()
	ready := make(chan struct{})
	go a.Run(actx, func(agent.Addrs) { close(ready) })
	<-ready
	dial := func(job string) (*sdk.Client, error) { // a client is one job's
		return sdk.Dial(ctx, acfg.Socket, sdk.Options{CallTimeout: time.Minute, Workers: cfg.Workers, JobToken: acfg.JobKeys.Token(job)})
	}
	var out []SaveResult
	for _, size := range cfg.Sizes {
		r, err := saveOne(ctx, dial, cfg, size)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func saveOne(ctx context.Context, dial func(job string) (*sdk.Client, error), cfg SaveConfig, size uint64) (SaveResult, error) {
	res := SaveResult{Size: size}
	per := (size / uint64(cfg.Tensors)) &^ 3
	src := make([]byte, size)
	fill(src)
	tensors := make([]sdk.Tensor, cfg.Tensors)
	for i := range tensors {
		tensors[i] = sdk.Tensor{Name: fmt.Sprintf("layer.%03d.weight", i), DType: shm.F32, Shape: []int64{int64(per / 4)}, Data: src[uint64(i)*per : uint64(i+1)*per]}
	}
	total := float64(per * uint64(cfg.Tensors))

	// Cold: every run a new job, so new segments are sized and mapped.
	var cold []float64
	for run := range cfg.Runs {
		d, err := saveCold(ctx, dial, fmt.Sprintf("bench-cold-%d-%d", size>>20, run), tensors)
		if err != nil {
			return res, err
		}
		cold = append(cold, d)
	}
	res.ColdSeconds = med(cold)
	res.SaveCold = total / res.ColdSeconds

	// memcpy into pre-faulted memory, one thread and Workers threads.
	dst, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return res, fmt.Errorf("bench: mapping %s for memcpy: %w", units.Bytes(size), err)
	}
	defer unix.Munmap(dst)
	copy(dst, src) // fault in every page
	w, err := saveWarm(ctx, dial, fmt.Sprintf("bench-warm-%d", size>>20), tensors, cfg.Runs, func() (one, par float64) {
		return float64(size) / timed(func() { copy(dst, src) }), float64(size) / timed(func() { parallelCopy(dst, src, cfg.Workers) })
	})
	if err != nil {
		return res, err
	}
	res.WarmSeconds = med(w.save)
	res.SaveWarm = total / res.WarmSeconds
	res.Memcpy, res.MemcpyParallel = med(w.one), med(w.par)
	toOne, toPar := make([]float64, len(w.save)), make([]float64, len(w.save))
	for i, d := range w.save {
		toOne[i], toPar[i] = total/d/w.one[i], total/d/w.par[i]
	}
	res.WarmToMemcpy, res.WarmToMemcpyParallel = med(toOne), med(toPar)
	return res, nil
}

// saveCold times one save of a new job: its segments are sized and mapped.
func saveCold(ctx context.Context, dial func(job string) (*sdk.Client, error), job string, tensors []sdk.Tensor) (float64, error) {
	c, err := dial(job)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	s, err := c.Session(job, 0, 1)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	if err := s.Save(ctx, 1, tensors, map[string]int{"step": 1}); err != nil {
		return 0, err
	}
	d := time.Since(t0).Seconds()
	s.Close()
	return d, cleanup(ctx, c, job)
}

// warmTimes is each warm save's time in seconds and the memcpy
// bandwidths (one thread, the save's workers) measured just before it.
type warmTimes struct {
	save, one, par []float64
}

// saveWarm times runs warm saves of one session saving step after step
// (the first two saves size and map the two slots, the rest reuse them),
// each right after memcpy gives the copy limit of the moment: on a
// shared machine the memory bandwidth varies from one second to the
// next, so each save is compared with the memcpy beside it.
func saveWarm(ctx context.Context, dial func(job string) (*sdk.Client, error), job string, tensors []sdk.Tensor, runs int, memcpy func() (one, par float64)) (warmTimes, error) {
	var w warmTimes
	c, err := dial(job)
	if err != nil {
		return w, err
	}
	defer c.Close()
	s, err := c.Session(job, 0, 1)
	if err != nil {
		return w, err
	}
	defer s.Close()
	for step := range int64(runs + 2) {
		if err := waitVerified(ctx, c, job); err != nil { // the agent's background check runs between steps, as between training steps
			return w, err
		}
		var one, par float64
		if step >= 2 {
			one, par = memcpy()
		}
		t0 := time.Now()
		if err := s.Save(ctx, step, tensors, map[string]int64{"step": step}); err != nil {
			return w, err
		}
		if step >= 2 {
			d := time.Since(t0).Seconds()
			if s.LastSave().Cold {
				return w, fmt.Errorf("bench: save of step %d was cold", step)
			}
			w.save, w.one, w.par = append(w.save, d), append(w.one, one), append(w.par, par)
		}
	}
	return w, cleanup(ctx, c, job)
}

func cleanup(ctx context.Context, c *sdk.Client, job string) error {
	if err := waitVerified(ctx, c, job); err != nil {
		return err
	}
	_, err := c.API().Delete(ctx, deleteAll(job))
	return err
}

// waitVerified waits until the agent has verified every committed shard of
// job, so its background pass does not overlap the next measurement.
func waitVerified(ctx context.Context, c *sdk.Client, job string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		shards, err := c.List(ctx, job)
		if err != nil {
			return err
		}
		done := true
		for _, s := range shards {
			if s.State == agentpb.ShardState_SHARD_STATE_COMMITTED && !s.Verified {
				done = false
			}
		}
		if done {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("bench: agent did not verify job %s within a minute", job)
}

func fill(b []byte) {
	var x uint64 = 0x9e3779b97f4a7c15
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i], b[i+1], b[i+2], b[i+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(x>>32), byte(x>>40), byte(x>>48), byte(x>>56)
	}
}

func parallelCopy(dst, src []byte, workers int) {
	var wg sync.WaitGroup
	per := (len(src) + workers - 1) / workers
	for lo := 0; lo < len(src); lo += per {
		hi := min(lo+per, len(src))
		wg.Go(func() { copy(dst[lo:hi], src[lo:hi]) })
	}
	wg.Wait()
}

// timed returns how long f takes, in seconds.
func timed(f func()) float64 {
	t0 := time.Now()
	f()
	return time.Since(t0).Seconds()
}

func sortedCopy(d []float64) []float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}

func med(d []float64) float64 {
	s := sortedCopy(d)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// PrintSave writes the results as a table.
func PrintSave(w io.Writer, rs []SaveResult, workers int) {
	same := fmt.Sprintf("warm/memcpy x%d", workers)
	fmt.Fprintf(w, "%-7s %12s %14s %12s %12s %12s %12s %11s %16s\n", "size", "memcpy", fmt.Sprintf("memcpy x%d", workers), "save cold", "save warm", "warm blocks", "cold blocks", "warm/memcpy", same)
	for _, r := range rs {
		fmt.Fprintf(w, "%-7s %12s %14s %12s %12s %12s %12s %11.2f %16.2f\n", units.Bytes(r.Size), gbps(r.Memcpy), gbps(r.MemcpyParallel),
			gbps(r.SaveCold), gbps(r.SaveWarm), secs(r.WarmSeconds), secs(r.ColdSeconds), r.WarmToMemcpy, r.WarmToMemcpyParallel)
	}
	fmt.Fprintf(w, "warm/memcpy: against one thread; %s: against a memcpy with as many threads as Save's copy workers (%d), the same-thread reference; each ratio the median over the warm saves of one save against the memcpy run right before it\n", same, workers)
}

func gbps(b float64) string { return fmt.Sprintf("%.1f GB/s", b/1e9) }
func secs(s float64) string { return fmt.Sprintf("%.0f ms", s*1e3) }
