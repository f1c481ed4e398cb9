package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/transport"
)

// PeerConfig configures the peer restore benchmark.
type PeerConfig struct {
	Size    uint64 // bytes of the shard restored
	Runs    int    // each run measures every figure once; medians are reported
	Tensors int    // the shard is split into this many tensors (0: 4)
	ShmDir  string // tmpfs for the agents' shared memory and the bare transfers' sinks
	Out     io.Writer
}

// PeerRun is one run's figures, in bytes per second.
type PeerRun struct {
	Plain, TLS       float64 // a peer restore into a new segment: plaintext TCP, mutual TLS
	BareTCP, BareTLS float64 // the same bytes over a bare loopback connection into memory already faulted in, plaintext or TLS
	Load             float64 // the 1-minute load average as the run began
}

// PeerResult is every run and the medians.
type PeerResult struct {
	Size                         uint64
	Runs                         []PeerRun
	Plain, TLS, BareTCP, BareTLS float64
	// TLSRatio is TLS/BareTLS (the target), PlainRatio Plain/BareTCP,
	// Cost TLS/Plain (what TLS leaves of a plaintext restore): each the
	// median of the runs' own ratios.
	TLSRatio, PlainRatio, Cost float64
	Met                        bool
}

// targetTLSRatio: a peer restore over TLS reaches this share of a bare
// TLS transfer of the same bytes.
const targetTLSRatio = 0.8

// Peer measures a restore of one rank's shard from a peer agent's memory,
// the path a recovery takes (Fetch with a peer as the source: the peer
// data path, every leaf hashed as it lands, committed into a new
// segment), once between two agents in plaintext and once between two
// agents with mutual TLS, against bare loopback transfers of the same
// bytes into memory already faulted in, plaintext and TLS, with the same
// certificates. Every figure is
// measured once per run, in turn, so that they share the machine's
// conditions; the medians are reported.
func Peer(ctx context.Context, cfg PeerConfig) (PeerResult, error) {
	res := PeerResult{Size: cfg.Size}
	if cfg.Runs < 1 {
		cfg.Runs = 5
	}
	if cfg.Tensors < 1 {
		cfg.Tensors = 4
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	root, err := os.MkdirTemp(cfg.ShmDir, "rewind-bench-peer-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(root)
	secs, err := peerCerts(filepath.Join(root, "certs"))
	if err != nil {
		return res, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	plain, err := startPeerPair(ctx, filepath.Join(root, "plain"), nil, nil, cfg)
	if err != nil {
		return res, err
	}
	defer plain.stop()
	tls, err := startPeerPair(ctx, filepath.Join(root, "tls"), secs[0], secs[1], cfg)
	if err != nil {
		return res, err
	}
	defer tls.stop()
	// The bare transfers land in memory faulted in beforehand: the limit
	// of the connection itself, which the restore (its new segment
	// prefaulted beside the receive) is held against, as the recovery
	// benchmark holds it against loopback TCP.
	src, dst := make([]byte, plain.ps.Size), make([]byte, plain.ps.Size)
	fill(src)
	fill(dst)
	sink := func() ([]byte, func(), error) { return dst, func() {}, nil }
	bare := func(server, client *transport.Security) func() (float64, error) {
		return func() (float64, error) { return bareOnce(ctx, server, client, src, sink) }
	}
	for i := range cfg.Runs {
		r, err := peerRun(i, plain.restore, bare(nil, nil), tls.restore, bare(secs[0], secs[1]))
		if err != nil {
			return res, err
		}
		fmt.Fprintf(cfg.Out, "run %d: restore plaintext %s, bare TCP %s; restore TLS %s, bare TLS %s (load %.2f)\n", i+1,
			gbps2(r.Plain), gbps2(r.BareTCP), gbps2(r.TLS), gbps2(r.BareTLS), r.Load)
		res.Runs = append(res.Runs, r)
	}
	pick := func(f func(PeerRun) float64) float64 {
		var v []float64
		for _, r := range res.Runs {
			v = append(v, f(r))
		}
		return med(v)
	}
	res.Plain, res.TLS = pick(func(r PeerRun) float64 { return r.Plain }), pick(func(r PeerRun) float64 { return r.TLS })
	res.BareTCP, res.BareTLS = pick(func(r PeerRun) float64 { return r.BareTCP }), pick(func(r PeerRun) float64 { return r.BareTLS })
	// The ratios are medians of each run's own ratio: a restore against
	// the bare transfer measured beside it, under the same load.
	res.TLSRatio = pick(func(r PeerRun) float64 { return r.TLS / r.BareTLS })
	res.PlainRatio = pick(func(r PeerRun) float64 { return r.Plain / r.BareTCP })
	res.Cost = pick(func(r PeerRun) float64 { return r.TLS / r.Plain })
	res.Met = res.TLSRatio >= targetTLSRatio
	return res, nil
}

// peerRun measures run i's four figures. Each restore is measured beside
// its bare transfer, in turn, so that a pair sees the same load; every
// other run the bare transfer goes first, so that a load that rises or
// falls through a run favours neither.
func peerRun(i int, plain, bareTCP, tls, bareTLS func() (float64, error)) (PeerRun, error) {
	r := PeerRun{Load: loadAverage()}
	type step struct {
		name string
		f    func() (float64, error)
		to   *float64
	}
	pairs := [][2]step{
		{{"peer restore (plaintext)", plain, &r.Plain}, {"bare TCP", bareTCP, &r.BareTCP}},
		{{"peer restore (TLS)", tls, &r.TLS}, {"bare TLS", bareTLS, &r.BareTLS}},
	}
	for _, p := range pairs {
		if i%2 == 1 {
			p[0], p[1] = p[1], p[0]
		}
		for _, s := range p {
			v, err := s.f()
			if err != nil {
				return r, fmt.Errorf("bench: run %d: %s: %w", i+1, s.name, err)
			}
			*s.to = v
		}
	}
	return r, nil
}

// bareOnce sends src over a fresh loopback connection (TLS when the
// securities are set: the holder's listens, the receiver's dials) into a
// buffer of sink, and returns the throughput from the dial to the last
// byte received.
func bareOnce(ctx context.Context, server, client *transport.Security, src []byte, sink func() ([]byte, func(), error)) (float64, error) {
	l, err := server.Listen("bench", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	dst, release, err := sink()
	if err != nil {
		return 0, err
	}
	defer release()
	deadline := time.Now().Add(time.Minute)
	sent := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			sent <- err
			return
		}
		defer c.Close()
		c.SetDeadline(deadline)
		_, err = c.Write(src)
		sent <- err
	}()
	t0 := time.Now()
	c, err := client.DialData(ctx, l.Addr().String(), transport.ExpectNode(peerHolder))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(deadline)
	if _, err := io.ReadFull(c, dst[:len(src)]); err != nil {
		return 0, err
	}
	d := time.Since(t0)
	if err := <-sent; err != nil {
		return 0, err
	}
	return float64(len(src)) / d.Seconds(), nil
}

// PrintPeer writes every run and the medians against the target.
func PrintPeer(w io.Writer, res PeerResult) {
	if len(res.Runs) == 0 {
		return
	}
	fmt.Fprintf(w, "%-4s %12s %12s %12s %12s %10s %5s\n", "run", "restore", "bare TCP", "restore TLS", "bare TLS", "TLS/bare", "load")
	lo, hi := res.Runs[0].Load, res.Runs[0].Load
	for i, r := range res.Runs {
		fmt.Fprintf(w, "%-4d %12s %12s %12s %12s %10.2f %5.2f\n", i+1, gbps2(r.Plain), gbps2(r.BareTCP), gbps2(r.TLS), gbps2(r.BareTLS), r.TLS/r.BareTLS, r.Load)
		lo, hi = min(lo, r.Load), max(hi, r.Load)
	}
	met := "NO"
	if res.Met {
		met = "yes"
	}
	fmt.Fprintf(w, "\nmedians of %d runs, a %s shard (1-minute load average as they began: %.2f to %.2f):\n", len(res.Runs), units.Bytes(res.Size), lo, hi)
	fmt.Fprintf(w, "%-44s %10s %8s %4s\n", "figure", "median", "target", "met")
	fmt.Fprintf(w, "%-44s %10s %8s %4s\n", "peer restore, plaintext TCP", gbps2(res.Plain), "", "")
	fmt.Fprintf(w, "%-44s %10s %8s %4s\n", "peer restore, mutual TLS", gbps2(res.TLS), "", "")
	fmt.Fprintf(w, "%-44s %10s %8s %4s\n", "bare loopback TCP, same bytes", gbps2(res.BareTCP), "", "")
	fmt.Fprintf(w, "%-44s %10s %8s %4s\n", "bare loopback TLS, same bytes", gbps2(res.BareTLS), "", "")
	fmt.Fprintf(w, "%-44s %10.2f %8s %4s\n", "peer restore TLS / bare TLS (per run)", res.TLSRatio, ">= 0.8", met)
	fmt.Fprintf(w, "%-44s %10.2f %8s %4s\n", "peer restore plaintext / bare TCP (per run)", res.PlainRatio, "", "")
	fmt.Fprintf(w, "%-44s %10.2f %8s %4s\n", "peer restore TLS / plaintext (per run)", res.Cost, "", "")
}
