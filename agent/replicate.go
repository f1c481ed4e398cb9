package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
	"rewind.dev/rewind/transport"
)

// peers keeps one gRPC connection per peer agent.
type peers struct {
	sec   *transport.Security
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // by node@addr
	// copying holds a cancel function per copy in progress, by the node
	// it reads from: a node declared dead has its copies cut at once.
	copying map[string]map[*context.CancelFunc]bool
	// dead are the nodes declared dead and not back since: a copy from
	// one ends before it starts (an order queued before the verdict would
	// otherwise dial a paused node, whose kernel still accepts, and wait).
	dead map[string]bool
}

// errPeerDead ends a copy from a node declared dead.
var errPeerDead = errors.New("the peer was declared dead")

// copyContext returns the context of a copy from node, which ends when
// the node is declared dead (cutCopies), or at once if it is; done
// unregisters it.
func (p *peers) copyContext(ctx context.Context, node string) (context.Context, func()) {
	cctx, cancel := context.WithCancelCause(ctx)
	dead := fmt.Errorf("agent: copy from %s: %w", node, errPeerDead)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead[node] {
		cancel(dead)
		return cctx, func() {}
	}
	if p.copying == nil {
		p.copying = map[string]map[*context.CancelFunc]bool{}
	}
	if p.copying[node] == nil {
		p.copying[node] = map[*context.CancelFunc]bool{}
	}
	stop := context.CancelFunc(func() { cancel(dead) })
	p.copying[node][&stop] = true
	return cctx, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.copying[node], &stop)
		cancel(nil)
	}
}

// cutCopies cancels every copy in progress from node, declared dead, and
// returns how many; copies from it fail at once until it is back
// (peerBack).
func (p *peers) cutCopies(node string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead == nil {
		p.dead = map[string]bool{}
	}
	p.dead[node] = true
	for c := range p.copying[node] {
		(*c)()
	}
	n := len(p.copying[node])
	delete(p.copying, node)
	return n
}

// forgetDead lets copies from every node start again (the verdicts were
// lost: a copy from a node still dead fails on its own deadlines).
func (p *peers) forgetDead() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.dead)
}

// peerBack lets copies from node start again: it is alive again.
func (p *peers) peerBack(node string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.dead, node)
}

// client returns a client of node's agent at addr, which must present
// node's certificate (any node's when node is empty).
func (p *peers) client(addr, node string) (agentpb.AgentClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := node + "@" + addr
	if c := p.conns[key]; c != nil {
		return agentpb.NewAgentClient(c), nil
	}
	c, err := p.sec.NewClient(addr, transport.ExpectNode(node))
	if err != nil {
		return nil, fmt.Errorf("agent: peer %s at %q: %w", node, addr, err)
	}
	if p.conns == nil {
		p.conns = map[string]*grpc.ClientConn{}
	}
	p.conns[key] = c
	return agentpb.NewAgentClient(c), nil
}

func (p *peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// PeerShard names a shard to copy from a peer agent's memory.
type PeerShard struct {
	Job       string
	Rank      uint32
	WorldSize uint32
	Step      int64
	Size      int64
	HeaderSum string
	Node      string // the peer, for messages
	Addr      string // its agent's TCP address
	// Stage, for a restore's fetch: the shard is staged for that restore
	// (stage.go) instead of committed.
	Stage string
}

// CopyFromPeer copies a shard from a peer agent's shared memory into this
// agent's, through the same prepare/commit path as a save: the shard is
// committed only after its size, header checksum and every tensor checksum
// match, so a torn or corrupt transfer leaves nothing behind; the slot of
// the rank's latest checkpoint here is never used. lim bounds the
// bandwidth (nil: none). A shard already held is not copied again.
func (a *Agent) CopyFromPeer(ctx context.Context, ps PeerShard, lim *tiers.Limiter) (int64, error) {
	return a.copyFromPeer(ctx, ps, lim, false)
}

// copyFromPeer is CopyFromPeer; place says the rank will run here (a
// restore), not that this node keeps a replica.
func (a *Agent) copyFromPeer(ctx context.Context, ps PeerShard, lim *tiers.Limiter, place bool) (int64, error) {
	if err := validateRank(ps.Job, ps.Rank, ps.WorldSize); err != nil {
		return 0, err
	}
	r := a.rank(ps.Job, ps.Rank, true)
	r.copyMu.Lock()
	defer r.copyMu.Unlock()
	if sh, release, err := a.pin(ps.Job, ps.Rank, ps.Step); err == nil {
		release()
		if sh.HeaderSum == ps.HeaderSum {
			return 0, nil
		}
	}
	if ps.Stage != "" && a.staged(ps) { // a fetch of the same restore asked again
		return 0, nil
	}
	peer, err := a.peers.client(ps.Addr, ps.Node)
	if err != nil {
		return 0, err
	}
	if place { // the prepare may adopt the warm segment: the next one is made once this copy is done
		defer func() { go a.fillWarm() }()
	}
	t0 := time.Now()
	prep, err := a.prepare(ctx, ps.Job, ps.Rank, ps.WorldSize, ps.Step, ps.Size, place, place, a.epochs.get(ps.Job).epoch, true)
	if err != nil {
		return 0, err
	}
	dst, unmap, err := a.copyTarget(prep)
	if err != nil {
		a.dropPrepared(ps.Job, ps.Rank, prep)
		return 0, fmt.Errorf("agent: copy of job %s rank %d step %d from %s: %w", ps.Job, ps.Rank, ps.Step, ps.Node, err)
	}
	t1 := time.Now()
	cctx, done := a.peers.copyContext(ctx, ps.Node) // cut when the peer is declared dead
	err = a.receiveData(cctx, ps, dst, lim)
	if errors.Is(err, errDataPath) { // an older peer: gRPC
		a.log.Debug("peer data path unavailable; copying over gRPC", "peer", ps.Node, "err", err)
		err = a.receive(cctx, peer, ps, dst, lim)
	}
	if err != nil && errors.Is(context.Cause(cctx), errPeerDead) {
		err = context.Cause(cctx)
	}
	done()
	unmap()
	if err != nil {
		a.dropPrepared(ps.Job, ps.Rank, prep)
		return 0, fmt.Errorf("agent: copy of job %s rank %d step %d from %s: %w", ps.Job, ps.Rank, ps.Step, ps.Node, err)
	}
	t2 := time.Now()
	if ps.Stage != "" {
		err = a.stage(ctx, ps, prep.Slot, prep.Token, true)
	} else {
		_, err = a.commit(ctx, ps.Job, ps.Rank, prep.Slot, prep.Token, ps.Step, ps.HeaderSum, true)
	}
	if err != nil {
		a.dropPrepared(ps.Job, ps.Rank, prep)
		return 0, err
	}
	if !place {
		if f := a.cfg.Faults.Eval(ctx, faultinject.AgentReplicaStored); f.Kind == faultinject.KindCorrupt {
			a.corruptSegment(prep.Path, prep.Size, f)
		} else if err := f.Err(); err != nil {
			return 0, fmt.Errorf("agent: replica of job %s rank %d step %d: %w", ps.Job, ps.Rank, ps.Step, err)
		}
	}
	a.log.Info("shard copied from a peer", "job", ps.Job, "rank", ps.Rank, "step", ps.Step, "peer", ps.Node, "bytes", ps.Size,
		"prepare_ms", t1.Sub(t0).Milliseconds(), "receive_and_check_ms", t2.Sub(t1).Milliseconds(),
		"commit_ms", time.Since(t2).Milliseconds(), "restore", place)
	return ps.Size, nil
}

// copyTarget maps the slot a copy fills: the warm segment adopted for it,
// mapped and faulted in already, or the slot's segment, mapped
// lazily and faulted in by another goroutine ahead of the arriving bytes:
// zeroing a new segment's pages, or filling the page table of any large
// one, costs about as much as receiving the bytes, and this way the two
// overlap. unmap stops that and unmaps in the background (the bytes are in
// the file); it must be called.
func (a *Agent) copyTarget(prep PrepareResult) (dst []byte, unmap func(), err error) {
	if m := a.warmMapping(prep.Path); m != nil {
		return m.Data[:prep.Size], func() { go m.Close() }, nil
	}
	f, err := a.cfg.FS.OpenFile(prep.Path, os.O_RDWR, 0)
	if err != nil {
		return nil, nil, err
	}
	m, err := shm.MapLazy(f, prep.Size, true)
	f.Close()
	if err != nil {
		return nil, nil, err
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		m.Prefault(stop)
	}()
	return m.Data, func() {
		close(stop)
		go func() {
			<-stopped
			m.Close()
		}()
	}, nil
}

// receive streams the shard into dst and checks it whole.
func (a *Agent) receive(ctx context.Context, peer agentpb.AgentClient, ps PeerShard, dst []byte, lim *tiers.Limiter) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := peer.Read(ctx, &agentpb.ReadRequest{Job: ps.Job, Rank: ps.Rank, Step: ps.Step})
	if err != nil {
		return err
	}
	var got int64
	for {
		chunk, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		off, n := int64(chunk.Offset), int64(len(chunk.Data))
		if off != got || off+n > int64(len(dst)) {
			return fmt.Errorf("%w: chunk of %d bytes at %d, expected offset %d of %d", shm.ErrCorrupt, n, off, got, len(dst))
		}
		if err := lim.Wait(ctx, int(n)); err != nil {
			return err
		}
		copy(dst[off:], chunk.Data)
		got += n
	}
	if got != int64(len(dst)) {
		return fmt.Errorf("%w: %d of %d bytes received", shm.ErrCorrupt, got, len(dst))
	}
	return a.checkReceived(ps, dst)
}

// checkReceived checks a shard copied from a peer: its header, that it is
// the shard asked for, and every tensor checksum.
func (a *Agent) checkReceived(ps PeerShard, dst []byte) error {
	h, err := shm.DecodeBytes(dst)
	if err != nil {
		return err
	}
	if f := a.cfg.Faults.Eval(context.Background(), faultinject.AgentReplicaReceived); f.Kind == faultinject.KindCorrupt {
		if off, err := corruptShard(dst, f); err == nil {
			a.log.Warn("fault: flipped a bit of a shard received from a peer", "node", ps.Node, "offset", off)
		}
	} else if err := f.Err(); err != nil {
		return err
	}
	if sum := shm.HeaderSum(dst[:h.DataStart]); sum != ps.HeaderSum {
		return fmt.Errorf("%w: header checksum %s, expected %s", shm.ErrCorrupt, sum, ps.HeaderSum)
	}
	if !h.Rewind || h.Meta.Job != ps.Job || h.Meta.Rank != ps.Rank || h.Meta.Step != ps.Step {
		return fmt.Errorf("%w: received %s rank %d step %d", shm.ErrCorrupt, h.Meta.Job, h.Meta.Rank, h.Meta.Step)
	}
	return h.Verify(dst, a.cfg.VerifyWorkers)
}

// Source is one place a restore can take a rank's shard from.
type Source struct {
	Tier string // "shm", or a tiers.Name
	Node string // "-" on a shared tier
	Addr string // the node's agent, for another node's shared memory
}

func (s Source) String() string { return s.Tier + ":" + s.Node }

// FetchFrom brings a shard into this agent's shared memory from the first
// of sources that serves it whole and verified, in order: this node's own
// memory (nothing to move), a peer's memory, one of this agent's tiers.
// Every failure, a checksum mismatch included, moves on to the next
// source; the result lists them. When every source failed, those that
// failed with an I/O error (EIO: this node's own prepare or commit, or a
// read of the copy) are tried once more: such an error is often not the
// copy's fault, and a restore that gives up on it marks a good step
// unrestorable. A source that was corrupt, gone or did not answer in time
// is not tried again: a hung peer would take a second full timeout. With
// ps.Stage the shard is staged for that restore (stage.go), not
// committed; res.Staged says whether a slot was (not when this node's
// memory held the shard already).
func (a *Agent) FetchFrom(ctx context.Context, ps PeerShard, sources []Source) (FetchResult, error) {
	if err := validateRank(ps.Job, ps.Rank, ps.WorldSize); err != nil {
		return FetchResult{}, err
	}
	res := FetchResult{Step: ps.Step, Size: ps.Size}
	for pass := 0; pass < 2 && len(sources) > 0 && ctx.Err() == nil; pass++ {
		var again []Source
		for _, src := range sources {
			t0 := time.Now()
			a.log.Info("restore source: trying", "job", ps.Job, "rank", ps.Rank, "step", ps.Step, "source", src.String(), "pass", pass+1)
			n, err := a.fetchSource(ctx, ps, src)
			if err == nil {
				res.Tier, res.Staged = src.String(), ps.Stage != "" && a.staged(ps)
				a.metrics.transfers.WithLabelValues(src.Tier, "fetch", "ok").Inc()
				a.metrics.tierBytes.WithLabelValues(src.Tier).Add(float64(n))
				return res, nil
			}
			a.metrics.transfers.WithLabelValues(src.Tier, "fetch", "failed").Inc()
			a.log.Warn("restore source failed; trying the next", "job", ps.Job, "rank", ps.Rank, "step", ps.Step, "source", src.String(), "pass", pass+1,
				"ms", time.Since(t0).Milliseconds(), "err", err)
			res.Failed = append(res.Failed, FetchAttempt{Tier: src.String(), Err: err})
			a.suspectTier(ps, src, err)
			if ctx.Err() != nil {
				break
			}
			if errors.Is(err, syscall.EIO) {
				again = append(again, src)
			}
		}
		sources = again
	}
	return res, fetchFailed(ctx, fmt.Sprintf("no source could restore job %s rank %d step %d", ps.Job, ps.Rank, ps.Step), res.Failed)
}

func (a *Agent) fetchSource(ctx context.Context, ps PeerShard, src Source) (int64, error) {
	if err := a.cfg.Faults.Check(ctx, faultinject.AgentRestoreFetched); err != nil {
		return 0, fmt.Errorf("agent: source %s: %w", src, err)
	}
	switch {
	case src.Tier == "shm" && src.Node == a.cfg.Node:
		sh, release, err := a.pin(ps.Job, ps.Rank, ps.Step)
		if err != nil {
			return 0, err
		}
		release()
		if sh.HeaderSum != ps.HeaderSum {
			return 0, fmt.Errorf("%w: agent: this node's copy has header checksum %s, the plan %s", shm.ErrCorrupt, sh.HeaderSum, ps.HeaderSum)
		}
		return 0, nil
	case src.Tier == "shm":
		if src.Addr == "" {
			return 0, fmt.Errorf("%w: agent: no address for node %s", ErrInvalid, src.Node)
		}
		p := ps
		p.Node, p.Addr = src.Node, src.Addr
		return a.copyFromPeer(ctx, p, nil, true)
	case tiers.Name(src.Tier).NodeLocal() && src.Node != a.cfg.Node:
		return 0, fmt.Errorf("%w: agent: the NVMe copy is on node %s", ErrNotFound, src.Node)
	default:
		n, _, err := a.fetchFrom(ctx, tiers.Name(src.Tier), ps.Job, ps.Rank, ps.Step, ps.Stage)
		return n, storeFailure(ctx, err)
	}
}

// evictReplicas frees replica segments for a save of the node's own that
// does not fit the budget, until need bytes are free or none is left to
// give: never a replica rank's newest copy, nor a step the job's pins hold,
// nor a segment being read or verified. job: only that job's replicas
// ("": any job's). skip is the rank being prepared (its lock is held); a
// rank busy elsewhere is passed over. It returns the bytes freed.
func (a *Agent) evictReplicas(job string, need int64, skip *lockedRank) int64 {
	ranks := a.rankList(job)
	var freed int64
	for _, r := range ranks {
		if freed >= need {
			break
		}
		if r == skip || !r.mu.TryLock() {
			continue
		}
		latest, pins := r.latest(), a.rep.pinned(r.job)
		var evicted []*slot
		keep := r.slots[:0]
		for _, s := range r.slots {
			if freed >= need || !s.Replica || s == latest || s.readers > 0 || s.verifying != nil || s.State == stateCommitted && pins.holds(s.Step) {
				keep = append(keep, s)
				continue
			}
			if err := a.cfg.FS.Remove(a.paths.Segment(r.job, r.rank, s.Index)); err != nil && !os.IsNotExist(err) {
				keep = append(keep, s)
				continue
			}
			evicted = append(evicted, s)
			freed += s.Size
			a.adjustUsed(r.job, -s.Size)
			a.log.Warn("replica evicted for a save of this node's own", "job", r.job, "rank", r.rank, "step", s.Step, "bytes", s.Size)
		}
		r.slots = keep
		for _, s := range evicted {
			a.gone(&r.rankState, s)
		}
		if err := a.persist(&r.rankState); err != nil {
			a.log.Error("persisting slots after evicting replicas", "err", err)
		}
		r.mu.Unlock()
	}
	return freed
}
