package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"rewind.dev/rewind/internal/units"
)

// RecoveryConfig configures the recovery benchmark.
type RecoveryConfig struct {
	Binary  string // the rewind binary; its `agent` subcommand runs the nodes
	Size    uint64 // bytes of state per rank
	Runs    int    // fresh clusters; the medians are reported
	Steps   int    // steps saved before the kill (0: 3)
	Tensors int    // the state is split into this many tensors (0: 4)
	DataDir string // parent of the coordinator's store and the agents' logs
	ShmDir  string // tmpfs for the agents' shared memory
	Out     io.Writer
}

// RecoveryRun is one run's figures: the recovery's timeline, as the
// coordinator's job event gives it, against the moment of the SIGKILL.
type RecoveryRun struct {
	Killed    string // the node killed
	Step      int64  // the step restored
	Detection time.Duration
	Planning  time.Duration
	Movement  time.Duration // plan to every rank's shard in memory on its node
	Total     time.Duration // SIGKILL to restored
	Bytes     uint64        // every rank's shard, in place
	PeerBytes uint64        // moved from a peer's memory
	Sources   map[string]uint32
	Peer      float64 // peer restore throughput, bytes per second
	TCP       float64 // plain loopback TCP of the same bytes, bytes per second
	TCPShm    float64 // the same into a fresh tmpfs mapping (first-touch faults included)
	GRPCRead  float64 // the restore's transfer alone: gRPC Read from the peer into touched memory
	Load      float64 // the machine's 1-minute load average as the run began (0: unknown)
}

// RecoveryResult is every run and the medians.
type RecoveryResult struct {
	Size                        uint64
	Runs                        []RecoveryRun
	Detection, Planning         time.Duration
	Movement, Total             time.Duration
	Peer, TCP, TCPShm, Ratio    float64
	GRPCRead                    float64
	DetectionMet, TotalMet, Met bool
}

// The targets.
const (
	targetDetection = 2 * time.Second
	targetTotal     = 5 * time.Second
	targetRatio     = 0.7
)

// The cluster: a coordinator and three agent processes; the job's ranks
// run on the first two, the third is the spare.
var (
	recoveryDomains = []string{"rack-a", "rack-b", "rack-a"}
	recoveryJob     = "bench-recovery"
	recoveryRanks   = 2
)

// shardOverhead bounds a shard's header and alignment, generously.
const shardOverhead = 8 << 20

// RecoveryShmNeeded is the shared memory a run needs: each rank's two
// slots on its node, two replica slots on a peer, and the restored copy.
func RecoveryShmNeeded(size uint64) uint64 {
	shard := size + shardOverhead
	return shard * uint64(recoveryRanks*2+recoveryRanks*2+2) // own slots, replicas, the restore, the spare's warm segment
}

// Recovery measures recovery from a node's death: a coordinator and three
// agent processes on loopback run failure detection; a job of two ranks
// saves a few steps, each replicated to a peer; then a node running a rank
// is SIGKILLed and its shared memory removed. The coordinator's job event
// times detection, planning and the restore of the rank onto the spare
// from a peer's memory, which is set against a plain loopback TCP
// transfer of the same bytes measured in the same run.
func Recovery(ctx context.Context, cfg RecoveryConfig) (RecoveryResult, error) {
	res := RecoveryResult{Size: cfg.Size}
	if cfg.Runs < 1 {
		cfg.Runs = 3
	}
	if cfg.Steps < 1 {
		cfg.Steps = 3
	}
	if cfg.Tensors < 1 {
		cfg.Tensors = 4
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if err := checkShm(cfg.ShmDir, cfg.Size); err != nil {
		return res, err
	}
	src, dst := make([]byte, cfg.Size), make([]byte, cfg.Size+shardOverhead)
	fill(src)
	fill(dst) // fault in every page
	for i := range cfg.Runs {
		r, err := recoveryRun(ctx, cfg, src, dst)
		if err != nil {
			return res, fmt.Errorf("bench: recovery run %d: %w", i+1, err)
		}
		fmt.Fprintf(cfg.Out, "run %d: killed %s, detected after %v, restored %v after the kill\n", i+1, r.Killed,
			r.Detection.Round(time.Millisecond), r.Total.Round(time.Millisecond))
		res.Runs = append(res.Runs, r)
	}
	res.summarize()
	return res, nil
}

func (res *RecoveryResult) summarize() {
	var det, plan, mov, tot, peer, tcp, tcpShm, read, ratio []float64
	for _, r := range res.Runs {
		det, plan = append(det, r.Detection.Seconds()), append(plan, r.Planning.Seconds())
		mov, tot = append(mov, r.Movement.Seconds()), append(tot, r.Total.Seconds())
		peer, tcp, ratio = append(peer, r.Peer), append(tcp, r.TCP), append(ratio, r.Peer/r.TCP)
		tcpShm, read = append(tcpShm, r.TCPShm), append(read, r.GRPCRead)
	}
	d := func(v []float64) time.Duration { return time.Duration(med(v) * float64(time.Second)) }
	res.Detection, res.Planning, res.Movement, res.Total = d(det), d(plan), d(mov), d(tot)
	res.Peer, res.TCP, res.TCPShm, res.Ratio = med(peer), med(tcp), med(tcpShm), med(ratio)
	res.GRPCRead = med(read)
	res.DetectionMet, res.TotalMet, res.Met = res.Detection < targetDetection, res.Total < targetTotal, res.Ratio >= targetRatio
}

// checkShm fails clearly when the tmpfs cannot hold a run.
func checkShm(dir string, size uint64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("bench: shared memory directory %s: %w", dir, err)
	}
	free, need := st.Bavail*uint64(st.Bsize), RecoveryShmNeeded(size)
	if free < need {
		return fmt.Errorf("bench: %s has %s free; the recovery benchmark needs %s for %s per rank "+
			"(%d ranks × 2 slots on their nodes, 2 replica slots each on a peer, 1 restored copy): free space or use a smaller --size",
			dir, units.Bytes(free), units.Bytes(need), units.Bytes(size), recoveryRanks)
	}
	return nil
}

// recoveryRun is one run on a fresh cluster, torn down before it returns.
func recoveryRun(ctx context.Context, cfg RecoveryConfig, src, dst []byte) (RecoveryRun, error) {
	var r RecoveryRun
	load := loadAverage()
	tcp, err := loopbackTCP(ctx, src, 3, func() ([]byte, func(), error) { return dst[:len(src)], func() {}, nil })
	if err != nil {
		return r, err
	}
	tcpShm, err := loopbackTCP(ctx, src, 3, freshShm(cfg.ShmDir, len(src)))
	if err != nil {
		return r, err
	}
	cl, err := startCluster(ctx, cfg)
	if err != nil {
		return r, err
	}
	defer cl.close()
	step, err := cl.train(ctx, src)
	if err != nil {
		return r, cl.withLogs(err)
	}
	victim, holder, moved, peerBytes, err := cl.pickVictim(ctx, step)
	if err != nil {
		return r, err
	}
	read, err := cl.grpcRead(ctx, holder, moved[0], step, dst, 2)
	if err != nil {
		return r, err
	}
	ev, killed, err := cl.killAndWatch(ctx, victim)
	if err != nil {
		return r, cl.withLogs(err)
	}
	for _, rank := range moved {
		if ev.Placement[rank] != cl.nodes[len(cl.nodes)-1].name {
			return r, fmt.Errorf("bench: rank %d moved to %s, not to the spare (%s)", rank, ev.Placement[rank], ev.Reason)
		}
	}
	if ev.Step != step || ev.Sources["shm:peer"] != uint32(len(moved)) {
		return r, fmt.Errorf("bench: recovery restored step %d from %v; want step %d, %d rank(s) from a peer's memory", ev.Step, ev.Sources, step, len(moved))
	}
	at := func(ns int64) time.Time { return time.Unix(0, ns) }
	r = RecoveryRun{Killed: victim, Step: ev.Step, Bytes: ev.Bytes, PeerBytes: peerBytes, Sources: ev.Sources, TCP: tcp, TCPShm: tcpShm, GRPCRead: read, Load: load,
		Detection: at(ev.DetectedUnixNano).Sub(killed),
		Planning:  at(ev.PlannedUnixNano).Sub(at(ev.DetectedUnixNano)),
		Movement:  at(ev.RestoredUnixNano).Sub(at(ev.PlannedUnixNano)),
		Total:     at(ev.RestoredUnixNano).Sub(killed)}
	if r.Movement <= 0 {
		return r, fmt.Errorf("bench: recovery event with no data movement time: %v", ev)
	}
	r.Peer = float64(peerBytes) / r.Movement.Seconds()
	return r, nil
}

// loopbackTCP returns the best-of-n throughput of sending src over a
// loopback TCP connection into the buffer sink gives (and then releases):
// the physical limit a peer restore on this machine is held against.
func loopbackTCP(ctx context.Context, src []byte, n int, sink func() ([]byte, func(), error)) (float64, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	var best float64
	for range n {
		dst, release, err := sink()
		if err != nil {
			return 0, err
		}
		d, err := tcpOnce(ctx, l, src, dst)
		release()
		if err != nil {
			return 0, fmt.Errorf("bench: loopback TCP: %w", err)
		}
		best = max(best, float64(len(src))/d.Seconds())
	}
	return best, nil
}

// freshShm returns a sink that maps a new file of size bytes in dir, so
// that a transfer pays for the kernel's first touch of its pages, as a
// restore into a new segment does.
func freshShm(dir string, size int) func() ([]byte, func(), error) {
	return func() ([]byte, func(), error) {
		f, err := os.CreateTemp(dir, "rewind-bench-tcp-")
		if err != nil {
			return nil, nil, err
		}
		defer f.Close()
		os.Remove(f.Name()) // the mapping keeps it
		if err := f.Truncate(int64(size)); err != nil {
			return nil, nil, err
		}
		b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, nil, err
		}
		return b, func() { unix.Munmap(b) }, nil
	}
}

func tcpOnce(ctx context.Context, l net.Listener, src, dst []byte) (time.Duration, error) {
	deadline := time.Now().Add(time.Minute)
	recv := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			recv <- err
			return
		}
		defer c.Close()
		c.SetDeadline(deadline)
		_, err = io.ReadFull(c, dst)
		recv <- err
	}()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", l.Addr().String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(deadline)
	t0 := time.Now()
	if _, err := c.Write(src); err != nil {
		return 0, err
	}
	if err := <-recv; err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// PrintRecovery writes every run and the medians against the targets.
func PrintRecovery(w io.Writer, res RecoveryResult) {
	if len(res.Runs) == 0 {
		return
	}
	fmt.Fprintf(w, "%-4s %-7s %5s %10s %9s %10s %10s %11s %-18s %9s %9s %9s %9s %6s %5s\n", "run", "killed", "step", "detection", "planning",
		"movement", "total", "peer bytes", "sources", "peer", "tcp", "tcp→shm", "grpc", "ratio", "load")
	for i, r := range res.Runs {
		fmt.Fprintf(w, "%-4d %-7s %5d %10s %9s %10s %10s %11s %-18s %9s %9s %9s %9s %6.2f %5.2f\n", i+1, r.Killed, r.Step, ms(r.Detection), ms(r.Planning),
			ms(r.Movement), ms(r.Total), units.Bytes(r.PeerBytes), sources(r.Sources), gbps2(r.Peer), gbps2(r.TCP), gbps2(r.TCPShm), gbps2(r.GRPCRead), r.Peer/r.TCP, r.Load)
	}
	met := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "NO"
	}
	lo, hi := res.Runs[0].Load, res.Runs[0].Load
	for _, r := range res.Runs {
		lo, hi = min(lo, r.Load), max(hi, r.Load)
	}
	fmt.Fprintf(w, "\nmedians of %d runs, %s per rank (1-minute load average as they began: %.2f to %.2f):\n", len(res.Runs), units.Bytes(res.Size), lo, hi)
	fmt.Fprintf(w, "%-36s %10s %8s %4s\n", "figure", "median", "target", "met")
	fmt.Fprintf(w, "%-36s %10s %8s %4s\n", "detection (SIGKILL to declared dead)", ms(res.Detection), "< 2 s", met(res.DetectionMet))
	fmt.Fprintf(w, "%-36s %10s %8s %4s\n", "planning", ms(res.Planning), "", "")
	fmt.Fprintf(w, "%-36s %10s %8s %4s\n", "data movement (plan to restored)", ms(res.Movement), "", "")
	fmt.Fprintf(w, "%-36s %10s %8s %4s\n", "kill to restored", ms(res.Total), "< 5 s", met(res.TotalMet))
	fmt.Fprintf(w, "%-36s %10s %8s %4s\n", "peer restore", gbps2(res.Peer), "", "")
	fmt.Fprintf(w, "%-36s %10s %8s %4s\n", "loopback TCP", gbps2(res.TCP), "", "")
	fmt.Fprintf(w, "%-36s %10s %8s %4s\n", "loopback TCP into a fresh tmpfs file", gbps2(res.TCPShm), "", "")
	fmt.Fprintf(w, "%-36s %10s %8s %4s\n", "gRPC Read alone (the fallback path)", gbps2(res.GRPCRead), "", "")
	fmt.Fprintf(w, "%-36s %10.2f %8s %4s\n", "peer restore / loopback TCP", res.Ratio, ">= 0.7", met(res.Met))
}

// loadAverage is the 1-minute load average (Linux), 0 when unknown: the
// figures of a run on a shared machine mean little without it.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	fmt.Sscan(string(b), &l)
	return l
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", d.Seconds()*1e3) }

func sources(s map[string]uint32) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(s)) {
		parts = append(parts, fmt.Sprintf("%s×%d", k, s[k]))
	}
	return strings.Join(parts, ",")
}

func gbps2(b float64) string { return fmt.Sprintf("%.2f GB/s", b/1e9) }
