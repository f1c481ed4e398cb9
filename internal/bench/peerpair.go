package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/transport"
)

// The peer restore benchmark's agents: a holder, whose memory has the
// shard, and a receiver, which restores it as a spare does in a recovery
// (its warm segment, allocated and faulted in ahead of need, takes the
// shard); in this process, each with its own shared-memory root, socket
// and loopback TCP port.
const (
	peerHolder   = "holder"
	peerReceiver = "receiver"
	peerJob      = "bench-peer"
)

// peerCerts makes a CA and the two agents' own node certificates, as
// `rewind certs` does, and returns the holder's and the receiver's
// security.
func peerCerts(dir string) ([2]*transport.Security, error) {
	var out [2]*transport.Security
	ca, err := transport.NewCA("rewind bench CA", time.Hour)
	if err != nil {
		return out, err
	}
	for i, n := range []string{peerHolder, peerReceiver} {
		d := filepath.Join(dir, n)
		if err := ca.IssueDir(d, transport.Leaf{Identity: transport.Identity{Role: transport.RoleNode, Name: n}, Validity: time.Hour}); err != nil {
			return out, err
		}
		if out[i], err = transport.Load(d, discardLog()); err != nil {
			return out, err
		}
	}
	return out, nil
}

// peerPair is a holder with the shard and a receiver that restores it.
type peerPair struct {
	holder, receiver *agent.Agent
	ps               agent.PeerShard
	warm             string       // the receiver's warm segment, there once ready
	dataPath         atomic.Int64 // shards the receiver took over the peer data path
	stops            []func()
}

func (p *peerPair) stop() {
	for i := len(p.stops) - 1; i >= 0; i-- {
		p.stops[i]()
	}
}

// startPeerPair starts the two agents under dir with the given
// securities (nil: plaintext) and saves the shard on the holder.
func startPeerPair(ctx context.Context, dir string, holderSec, receiverSec *transport.Security, cfg PeerConfig) (_ *peerPair, err error) {
	p := &peerPair{}
	defer func() {
		if err != nil {
			p.stop()
		}
	}()
	var addrs agent.Addrs
	if p.holder, addrs, err = p.start(ctx, dir, peerHolder, holderSec, nil, 0); err != nil {
		return p, err
	}
	c, err := sdk.Dial(ctx, addrs.Socket, sdk.Options{CallTimeout: 2 * time.Minute})
	if err != nil {
		return p, err
	}
	defer c.Close()
	s, err := c.Session(peerJob, 0, 1)
	if err != nil {
		return p, err
	}
	defer s.Close()
	per := (cfg.Size / uint64(cfg.Tensors)) &^ 3
	buf := make([]byte, per*uint64(cfg.Tensors))
	fill(buf)
	tensors := make([]sdk.Tensor, cfg.Tensors)
	for i := range tensors {
		tensors[i] = sdk.Tensor{Name: fmt.Sprintf("layer.%03d.weight", i), DType: shm.F32, Shape: []int64{int64(per / 4)}, Data: buf[uint64(i)*per : uint64(i+1)*per]}
	}
	if err := s.Save(ctx, 1, tensors, nil); err != nil {
		return p, fmt.Errorf("bench: saving %s on the holder: %w", units.Bytes(cfg.Size), err)
	}
	for _, sh := range p.holder.List(peerJob) {
		p.ps = agent.PeerShard{Job: peerJob, Rank: 0, WorldSize: 1, Step: 1, Size: sh.Size, HeaderSum: sh.HeaderSum, Node: peerHolder, Addr: addrs.TCP}
	}
	if p.ps.Size == 0 {
		return p, errors.New("bench: the holder lists no shard after the save")
	}
	if p.receiver, _, err = p.start(ctx, dir, peerReceiver, receiverSec, &p.dataPath, p.ps.Size); err != nil {
		return p, err
	}
	p.warm = filepath.Join(dir, peerReceiver, "shm", ".warm") // agent/warm.go: renamed there once ready
	return p, nil
}

// start runs one agent; dataPath, when set, counts the shards it
// received over the peer data path (from its log); warm is its warm
// segment's size (0: none).
func (p *peerPair) start(ctx context.Context, dir, node string, sec *transport.Security, dataPath *atomic.Int64, warm int64) (*agent.Agent, agent.Addrs, error) {
	cfg := agent.DefaultConfig()
	cfg.Node, cfg.ShmRoot, cfg.Socket = node, filepath.Join(dir, node, "shm"), filepath.Join(dir, node+".sock")
	cfg.ListenAddr, cfg.MetricsAddr, cfg.Transport = "127.0.0.1:0", "", sec
	cfg.VerifyAfterCommit = false // the receiver checks every leaf as it lands; a second pass would compete with the next run
	cfg.WarmSegment = warm
	cfg.Logger = discardLog()
	if dataPath != nil {
		cfg.Logger = slog.New(countHandler{msg: "shard received over the peer data path", n: dataPath})
	}
	a, err := agent.New(cfg)
	if err != nil {
		return nil, agent.Addrs{}, err
	}
	actx, cancel := context.WithCancel(ctx)
	ready, done := make(chan agent.Addrs, 1), make(chan error, 1)
	go func() { done <- a.Run(actx, func(ad agent.Addrs) { ready <- ad }) }()
	select {
	case ad := <-ready:
		p.stops = append(p.stops, func() { cancel(); <-done })
		return a, ad, nil
	case err := <-done:
		cancel()
		return nil, agent.Addrs{}, fmt.Errorf("bench: agent %s: %w", node, err)
	}
}

// restore restores the shard onto the receiver from the holder's memory,
// as a recovery's Fetch does, and returns the throughput; the copy is
// deleted afterwards, so that the next restore writes a new segment.
func (p *peerPair) restore() (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.waitWarm(ctx); err != nil {
		return 0, err
	}
	before := p.dataPath.Load()
	t0 := time.Now()
	res, err := p.receiver.FetchFrom(ctx, p.ps, []agent.Source{{Tier: "shm", Node: peerHolder, Addr: p.ps.Addr}})
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if _, _, err := p.receiver.Delete(peerJob, 0, false, -1); err != nil {
		return 0, err
	}
	if res.Tier != "shm:"+peerHolder || p.dataPath.Load() != before+1 {
		return 0, fmt.Errorf("bench: the restore came from %s, not over the peer data path", res.Tier)
	}
	// The next warm segment is made in the background after a restore:
	// let it finish before the next figure is measured, not during it.
	if err := p.waitWarm(ctx); err != nil {
		return 0, err
	}
	return float64(p.ps.Size) / d.Seconds(), nil
}

// waitWarm waits until the receiver's warm segment is ready.
func (p *peerPair) waitWarm(ctx context.Context) error {
	return poll(ctx, time.Minute, "the receiver's warm segment", func() (bool, error) {
		_, err := os.Stat(p.warm)
		return err == nil, nil
	})
}

// countHandler counts the log records whose message contains msg, and
// writes nothing.
type countHandler struct {
	msg string
	n   *atomic.Int64
}

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.msg) {
		h.n.Add(1)
	}
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
