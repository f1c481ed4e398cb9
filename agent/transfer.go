package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// transfers runs the tier transfers the coordinator orders: it keeps one
// stream of orders open, runs them on a bounded pool of workers under the
// node's bandwidth limit, and reports how each ended and how each tier is
// doing. A failing transfer is retried with backoff while its tier shows
// degraded; it never touches the shards in shared memory beyond reading
// them.
type transfers struct {
	a     *Agent
	c     coordpb.CoordinatorClient
	names []string // the agent's tiers, nearest first
	lim   *tiers.Limiter
	queue chan *coordpb.TransferOrder // to the tiers
	peerQ chan *coordpb.TransferOrder // replicas: their own workers, never behind a tier upload

	mu     sync.Mutex
	events []*coordpb.TierEvent // not yet acknowledged by the coordinator
	health map[string]*tierHealth
	dirty  bool // health changed since it was last sent
	wake   chan struct{}
}

type tierHealth struct {
	store           string
	degraded        bool
	err             string
	queued, running int
	bytesTotal      int64        // of the pushes queued or running
	bytesDone       atomic.Int64 // of those, moved so far
	rate            float64      // bytes per second of the last push
}

// maxQueuedTransfers bounds the orders an agent holds; past it an order
// fails at once and the coordinator schedules a later step.
const maxQueuedTransfers = 4096

// maxPendingEvents bounds the outcomes kept while the coordinator is away.
const maxPendingEvents = 100_000

func newTransfers(a *Agent) *transfers {
	t := &transfers{a: a, c: a.rep.c, lim: tiers.NewLimiter(a.cfg.TransferBandwidth, a.cfg.Clock),
		queue: make(chan *coordpb.TransferOrder, maxQueuedTransfers), peerQ: make(chan *coordpb.TransferOrder, maxQueuedTransfers), health: map[string]*tierHealth{}, wake: make(chan struct{}, 1)}
	for _, n := range tierOrder(a.cfg.Stores) {
		t.names = append(t.names, string(n))
		h := &tierHealth{store: a.cfg.Stores[n].String()}
		t.health[string(n)] = h
		if w, ok := a.cfg.Stores[n].(tiers.RetryWatcher); ok {
			// A store that retries inside one call (S3, for minutes)
			// shows degraded from its first retry, not once it gives up;
			// the transfer's success clears it (finish).
			w.WatchRetries(func(op, name string, attempt int, err error) {
				t.setHealth(h, fmt.Errorf("retrying %s of %s (attempt %d): %w", op, name, attempt, err))
			})
		}
	}
	return t
}

// tierOrder lists the tiers of stores nearest (cheapest to restore from)
// first.
func tierOrder(stores map[tiers.Name]tiers.Store) []tiers.Name {
	var out []tiers.Name
	for _, n := range tiers.Names() {
		if stores[n] != nil {
			out = append(out, n)
		}
	}
	return out
}

// run serves until ctx ends.
func (t *transfers) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range t.a.cfg.TransferWorkers {
		wg.Go(func() { t.work(ctx, t.queue) })
		wg.Go(func() { t.work(ctx, t.peerQ) })
	}
	wg.Go(func() { t.subscribe(ctx) })
	wg.Go(func() { t.report(ctx) })
	wg.Wait()
}

// subscribe keeps the stream of orders open, reconnecting with backoff.
func (t *transfers) subscribe(ctx context.Context) {
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		// The gangs held broken go with each (re)connection: a coordinator
		// that lost the recovery that broke them finishes it.
		req := &coordpb.TransfersRequest{Node: t.a.cfg.Node, Tiers: t.names, BrokenGangs: t.a.gang.brokenJobs()}
		stream, err := t.c.Transfers(ctx, req)
		for err == nil {
			var o *coordpb.TransferOrder
			if o, err = stream.Recv(); err == nil {
				t.enqueue(o)
				backoff = 200 * time.Millisecond
			}
		}
		if ctx.Err() == nil {
			t.a.log.Debug("transfer stream ended; reconnecting", "err", err, "in", backoff)
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (t *transfers) enqueue(o *coordpb.TransferOrder) {
	switch x := o.Order.(type) { // gang orders at once, not behind transfers
	case *coordpb.TransferOrder_Abort:
		t.a.epochs.raise(o.Job, x.Abort.Epoch, o.Step)
		t.a.gang.abort(o.Job, o.Step, x.Abort.Reason)
		t.a.log.Warn("job's gang broken: its ranks' calls fail until the recovery is done", "job", o.Job, "restoring", o.Step, "reason", x.Abort.Reason)
		t.a.discardAfter(o.Job, o.Step)
		return
	case *coordpb.TransferOrder_Resume:
		t.a.epochs.raise(o.Job, x.Resume.Epoch, o.Step)
		// The coordinator sends a job's last gang order again (replay)
		// when this stream reconnects or this agent reports the job's
		// gang broken (coordinator/gang.go): a replayed resume only ends
		// a break; the steps after its step may be the job's since.
		if x.Resume.Replay {
			if t.a.gang.breaking(o.Job) {
				t.a.gang.resume(o.Job, o.Step)
				t.a.log.Info("job recovered (its resume sent again): its ranks may save again", "job", o.Job, "step", o.Step)
			} else {
				t.a.log.Debug("job's resume sent again; its gang is not broken here: nothing to do", "job", o.Job, "step", o.Step)
			}
			return
		}
		t.a.discardAfter(o.Job, o.Step) // anything committed since the abort
		t.a.gang.resume(o.Job, o.Step)
		t.a.log.Info("job recovered: its ranks may save again", "job", o.Job, "step", o.Step)
		return
	}
	t.mu.Lock()
	h := t.health[o.TierName()]
	if h != nil {
		h.queued++
	}
	t.mu.Unlock()
	q := t.queue
	if o.GetReplicate() != nil {
		q = t.peerQ
	}
	select {
	case q <- o:
	default:
		t.finish(o, h, 0, 0, fmt.Errorf("agent: %d transfers already queued", maxQueuedTransfers))
	}
}

func (t *transfers) work(ctx context.Context, q <-chan *coordpb.TransferOrder) {
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-q:
			t.run1(ctx, o)
		}
	}
}

// run1 runs one order, with retries, and records how it ended.
func (t *transfers) run1(ctx context.Context, o *coordpb.TransferOrder) {
	st := t.a.cfg.Stores[tiers.Name(o.TierName())]
	t.mu.Lock()
	h := t.health[o.TierName()]
	if h != nil {
		h.queued--
		h.running++
		t.dirty = true
	}
	t.mu.Unlock()
	if st == nil && o.GetReplicate() == nil {
		t.finish(o, nil, 0, 0, fmt.Errorf("%w: agent: node %s has no tier %q", ErrInvalid, t.a.cfg.Node, o.TierName()))
		return
	}
	start := t.a.cfg.Clock.Now()
	var n int64
	err := t.retry(ctx, o, h, func(ctx context.Context) (err error) {
		n, err = t.do(ctx, st, o, h)
		return err
	})
	t.finish(o, h, n, t.a.cfg.Clock.Now().Sub(start), err)
}

// do runs one attempt of an order and returns the bytes it moved.
func (t *transfers) do(ctx context.Context, st tiers.Store, o *coordpb.TransferOrder, h *tierHealth) (int64, error) {
	switch x := o.Order.(type) {
	case *coordpb.TransferOrder_Push:
		e, err := t.a.push(ctx, st, o.Job, x.Push.Rank, o.Step, func(size int64, src io.ReaderAt) io.ReaderAt {
			t.mu.Lock()
			h.bytesTotal += size
			t.mu.Unlock()
			return &countingReader{r: tiers.LimitReaderAt(ctx, src, t.lim), n: &h.bytesDone}
		}, func(size int64) {
			t.mu.Lock()
			h.bytesTotal -= size
			h.bytesDone.Add(-size)
			t.mu.Unlock()
		})
		return e.Size, err
	case *coordpb.TransferOrder_Manifest:
		mo := x.Manifest
		m := &tiers.Manifest{Job: o.Job, Step: o.Step, WorldSize: mo.WorldSize}
		for _, s := range mo.Shards {
			m.Shards = append(m.Shards, tiers.ShardEntry{Rank: s.Rank, Size: int64(s.SizeBytes), HeaderChecksum: s.HeaderChecksum})
		}
		if tiers.Name(mo.Tier).NodeLocal() {
			m.Here = slices.Sorted(slices.Values(mo.Ranks))
		}
		if err := tiers.WriteManifest(ctx, st, m); err != nil {
			return 0, err
		}
		return 0, t.a.cfg.Faults.Check(ctx, faultinject.AgentTierManifest)
	case *coordpb.TransferOrder_Replicate:
		r := x.Replicate
		return t.a.CopyFromPeer(ctx, PeerShard{Job: o.Job, Rank: r.Rank, WorldSize: r.WorldSize, Step: o.Step,
			Size: int64(r.SizeBytes), HeaderSum: r.HeaderChecksum, Node: r.SourceNode, Addr: r.SourceAddr}, t.lim)
	case *coordpb.TransferOrder_Delete:
		// The manifest goes first: from then on the copy does not exist,
		// whatever happens to the deletion of its shards.
		if err := st.Delete(ctx, tiers.ManifestName(o.Job, o.Step)); err != nil {
			return 0, err
		}
		for _, r := range x.Delete.Ranks {
			for _, name := range []string{tiers.ShardName(o.Job, o.Step, r), tiers.LeavesName(o.Job, o.Step, r)} {
				if err := st.Delete(ctx, name); err != nil {
					return 0, err
				}
			}
		}
		return 0, nil
	default:
		return 0, fmt.Errorf("%w: agent: unknown transfer order kind %v", ErrInvalid, o.Kind())
	}
}

// retry runs f until it succeeds, fails for good, or the attempts run out;
// between attempts the tier shows degraded with the error.
func (t *transfers) retry(ctx context.Context, o *coordpb.TransferOrder, h *tierHealth, f func(context.Context) error) error {
	backoff := t.a.cfg.TransferBackoff
	attempts := t.a.cfg.TransferAttempts
	if o.GetReplicate() != nil {
		attempts = 1 // the rank's next commit brings a newer replica sooner than a retry
	}
	for attempt := 1; ; attempt++ {
		err := f(ctx)
		if err == nil || attempt >= attempts || !retryable(err) || ctx.Err() != nil {
			return err
		}
		t.setHealth(h, err)
		t.a.log.Warn("tier transfer failed; retrying", "kind", o.Kind().Label(), "job", o.Job, "step", o.Step, "rank", o.RankOf(),
			"tier", o.TierName(), "attempt", attempt, "in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// retryable: a shard gone from memory, a bad order, a corrupt shard or a
// full disk will not heal by waiting for it.
func retryable(err error) bool {
	var nospace *shm.NoSpaceError
	return !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrInvalid) && !errors.Is(err, shm.ErrCorrupt) &&
		!errors.As(err, &nospace) && !errors.Is(err, syscall.ENOSPC)
}

func (t *transfers) setHealth(h *tierHealth, err error) {
	if h == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	h.degraded, h.err, t.dirty = err != nil, "", true
	if err != nil {
		h.err = err.Error()
	}
}

// finish records an order's outcome for the coordinator and the metrics.
func (t *transfers) finish(o *coordpb.TransferOrder, h *tierHealth, n int64, d time.Duration, err error) {
	kind, tier, rank := o.Kind(), o.TierName(), o.RankOf()
	ev := &coordpb.TierEvent{Order: o.Id, Kind: kind, Job: o.Job, Step: o.Step, Tier: tier, Rank: rank,
		Ok: err == nil, Bytes: uint64(n), DurationNanos: int64(d)}
	result := "ok"
	if err != nil {
		ev.Error, result = err.Error(), "failed"
		t.a.log.Error("tier transfer failed", "kind", kind.Label(), "job", o.Job, "step", o.Step, "rank", rank, "tier", tier, "err", err)
	} else if kind == coordpb.OrderKind_ORDER_KIND_PUSH {
		t.a.log.Info("shard pushed to tier", "job", o.Job, "rank", rank, "step", o.Step, "tier", tier, "bytes", n, "seconds", d.Seconds())
	}
	if tier == "" { // a replica, into this node's shared memory
		tier = "shm"
	}
	t.a.metrics.transfers.WithLabelValues(tier, kind.Label(), result).Inc()
	t.a.metrics.tierBytes.WithLabelValues(tier).Add(float64(n))
	t.mu.Lock()
	if h != nil {
		h.running--
		if kind == coordpb.OrderKind_ORDER_KIND_PUSH && err == nil && d > 0 {
			h.rate = float64(n) / d.Seconds()
		}
		// Only a write proves the tier healthy again: a deletion that
		// works on a full disk does not.
		if err != nil {
			h.degraded, h.err = true, err.Error()
		} else if kind != coordpb.OrderKind_ORDER_KIND_DELETE {
			h.degraded, h.err = false, ""
		}
	}
	if len(t.events) < maxPendingEvents {
		t.events = append(t.events, ev)
	}
	t.dirty = true
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// report sends outcomes and tier health to the coordinator as they happen,
// and the health every second while something moves.
func (t *transfers) report(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.wake:
		case <-tick.C:
		}
		req, sent := t.pending()
		if req == nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := t.c.TierReport(cctx, req)
		cancel()
		if err != nil {
			t.mu.Lock()
			t.dirty = true
			t.mu.Unlock()
			t.a.log.Debug("tier report not delivered; will resend", "err", err)
			continue
		}
		t.mu.Lock()
		t.events = t.events[sent:]
		t.mu.Unlock()
	}
}

// pending builds the next report, or nil when there is nothing to say.
func (t *transfers) pending() (*coordpb.TierReportRequest, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	busy := false
	for _, h := range t.health {
		busy = busy || h.running > 0 || h.queued > 0
	}
	if !t.dirty && !busy && len(t.events) == 0 {
		return nil, 0
	}
	t.dirty = false
	n := min(len(t.events), 1024)
	req := &coordpb.TierReportRequest{Node: t.a.cfg.Node, Events: slices.Clone(t.events[:n])}
	req.Health = t.healthLocked()
	return req, n
}

func (t *transfers) healthLocked() []*coordpb.TierHealth {
	var out []*coordpb.TierHealth
	for _, n := range t.names {
		h := t.health[n]
		out = append(out, &coordpb.TierHealth{Tier: n, Store: h.store, Degraded: h.degraded, Error: h.err,
			Queued: uint32(max(h.queued, 0)), Running: uint32(max(h.running, 0)),
			BytesDone: uint64(max(h.bytesDone.Load(), 0)), BytesTotal: uint64(max(h.bytesTotal, 0)), BytesPerSec: h.rate})
	}
	return out
}

// countingReader counts the bytes read through it, for progress.
type countingReader struct {
	r io.ReaderAt
	n *atomic.Int64
}

func (c *countingReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// SliceAt passes a store's request for the bytes in place on, counting
// them (tiers.SliceReaderAt).
func (c *countingReader) SliceAt(off int64, n int) ([]byte, error) {
	b, err := tiers.SliceAt(c.r, off, n)
	if err == nil {
		c.n.Add(int64(n))
	}
	return b, err
}
