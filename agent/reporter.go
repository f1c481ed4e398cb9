package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/transport"
)

// reporter tells the coordinator what this agent commits, in order, without
// ever making a save wait for it: agent operations append to a queue, and
// one goroutine drains it. On every (re)connection the agent registers with
// its whole inventory, so a coordinator that lost its store, or missed
// reports while it was down, is brought up to date.
type reporter struct {
	a    *Agent
	addr string
	conn *grpc.ClientConn
	c    coordpb.CoordinatorClient

	mu       sync.Mutex
	queue    []event
	next     uint64 // sequence of the next event
	wake     chan struct{}
	overflow bool // events were dropped: re-register with the inventory

	pinMu      sync.Mutex
	pins       map[string]pin     // job -> latest consistent step
	asked      uint64             // sequence of the last request that can answer pins
	registered map[rankKey]uint32 // ranks whose job registration was queued, by world size

	suspectMu sync.Mutex
	suspects  suspects // corrupt tier copies to report (tiersuspect.go)
}

// pin is a job's pins as an answer told them. Answers can arrive out of
// order (a Latest call beside the report stream): asked is the sequence
// of the request answered, and an answer to an earlier request never
// replaces one to a later request, so an old answer cannot bring back a
// step that is no longer pinned.
type pin struct {
	pins  pinSet
	asked uint64
}

// pinSet is the steps of a job that the node keeps whatever its saves
// need (coordpb.Pin): the latest consistent step, and the protected one,
// the newest that outlives the loss of any one node. -1: none.
//
// With newer set (pins from a coordinator), a rank's committed steps
// newer than the consistent one are kept too: the coordinator may have
// made one of them consistent, and answered so, before this agent's
// next answer tells it. Its slot is reused only once an answer says the
// latest consistent step is at or past it (DESIGN invariant 9: the step
// an answer named must stay whole on every rank, through a coordinator
// crash, for the successor to find it).
type pinSet struct {
	consistent, protected int64
	newer                 bool
}

// noPins holds no step.
var noPins = pinSet{-1, -1, false}

// unconfirmed reports whether step is newer than the consistent step and
// the pins keep such steps.
func (p pinSet) unconfirmed(step int64) bool { return p.newer && step > p.consistent }

// holds reports whether step is pinned.
func (p pinSet) holds(step int64) bool {
	return step >= 0 && (step == p.consistent || step == p.protected)
}

// split reports whether the pins hold two steps: the protected step is
// older than the consistent one while the latter's replicas are made.
func (p pinSet) split() bool {
	return p.protected >= 0 && p.protected != p.consistent
}

type event struct {
	seq uint64
	job *coordpb.RegisterJobRequest
	rec *coordpb.ShardRecord
}

// maxQueue bounds the events held while the coordinator is unreachable;
// past it the oldest are dropped and the inventory resent on reconnect.
const maxQueue = 100_000

func newReporter(a *Agent, addr string) (*reporter, error) {
	conn, err := a.cfg.Transport.NewClient(addr, transport.ExpectCoordinator,
		// Fixed flow-control windows, as the coordinator's: no BDP ping
		// round trip per answer received (coordinator/run.go).
		grpc.WithStaticStreamWindowSize(1<<20), grpc.WithStaticConnWindowSize(1<<20), coordpb.KeepaliveDial(), coordpb.ReconnectDial())
	if err != nil {
		return nil, fmt.Errorf("agent: coordinator address %q: %w", addr, err)
	}
	return &reporter{a: a, addr: addr, conn: conn, c: coordpb.NewCoordinatorClient(conn),
		wake: make(chan struct{}, 1), pins: map[string]pin{}, registered: map[rankKey]uint32{}, suspects: newSuspects()}, nil
}

// refreshPin asks the coordinator for a job's pins now, for a save that
// finds every slot held and the pins possibly stale, and returns the pins
// as they then stand.
func (r *reporter) refreshPin(ctx context.Context, job string) pinSet {
	if r == nil {
		return noPins
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	asked := r.ask()
	resp, err := r.c.Latest(ctx, &coordpb.LatestRequest{Job: job})
	if err != nil {
		r.a.log.Warn("cannot refresh the latest consistent step from the coordinator", "job", job, "err", err)
		return r.pinned(job)
	}
	r.setPins(asked, []*coordpb.Pin{{Job: job, Step: resp.Step, Protected: resp.Protected}})
	return r.pinned(job)
}

// ask numbers a request whose answer carries pins; call it before sending.
func (r *reporter) ask() uint64 {
	r.pinMu.Lock()
	defer r.pinMu.Unlock()
	r.asked++
	return r.asked
}

func (r *reporter) push(e event) {
	if r == nil {
		return
	}
	r.mu.Lock()
	e.seq = r.next
	r.next++
	r.queue = append(r.queue, e)
	if len(r.queue) > maxQueue {
		r.queue = r.queue[len(r.queue)-maxQueue:]
		r.overflow = true
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *reporter) shard(job string, rank, ws uint32, step int64, size int64, sum string, state coordpb.CopyState) {
	r.shardOfEpoch(job, rank, ws, step, size, sum, state, 0)
}

// shardOfEpoch queues a shard event naming the epoch of the save (see
// coordpb.ShardRecord.epoch).
func (r *reporter) shardOfEpoch(job string, rank, ws uint32, step int64, size int64, sum string, state coordpb.CopyState, epoch uint64) {
	if r == nil {
		return
	}
	r.push(event{rec: &coordpb.ShardRecord{Job: job, Step: step, Rank: rank, WorldSize: ws, Node: r.a.cfg.Node,
		SizeBytes: uint64(size), HeaderChecksum: sum, State: state, Epoch: epoch}})
}

// registerJob queues the registration of a rank of a job, once per
// session and world size.
func (r *reporter) registerJob(job string, rank, ws uint32, epoch uint64) {
	if r == nil {
		return
	}
	r.pinMu.Lock()
	k := rankKey{job, rank}
	done := r.registered[k] == ws
	r.registered[k] = ws
	r.pinMu.Unlock()
	if done {
		return
	}
	r.push(event{job: &coordpb.RegisterJobRequest{Job: job, WorldSize: ws, Placement: map[uint32]string{rank: r.a.cfg.Node}, Epoch: epoch}})
}

// pinned returns the job's pins. Without a coordinator none; with one
// that has not answered for the job yet, every committed step is newer
// than its (unknown) consistent step.
func (r *reporter) pinned(job string) pinSet {
	if r == nil {
		return noPins
	}
	r.pinMu.Lock()
	defer r.pinMu.Unlock()
	if p, ok := r.pins[job]; ok {
		return p.pins
	}
	return pinSet{-1, -1, true}
}

// told returns the pins every job's answers set, for a registration: a
// coordinator that has not rebuilt a job up to them yet does not answer
// for it (coordinator/rebuild.go).
func (r *reporter) told() []*coordpb.Pin {
	r.pinMu.Lock()
	defer r.pinMu.Unlock()
	out := make([]*coordpb.Pin, 0, len(r.pins))
	for job, p := range r.pins {
		if p.pins.consistent >= 0 {
			e := r.a.epochs.get(job)
			out = append(out, &coordpb.Pin{Job: job, Step: p.pins.consistent, Protected: p.pins.protected, Epoch: e.epoch, EpochStep: e.step})
		}
	}
	return out
}

// setPins applies the pins of the answer to request asked (see pin).
func (r *reporter) setPins(asked uint64, pins []*coordpb.Pin) {
	r.pinMu.Lock()
	for _, p := range pins {
		if old, ok := r.pins[p.Job]; !ok || old.asked <= asked {
			r.pins[p.Job] = pin{pins: pinSet{consistent: p.Step, protected: p.Protected, newer: true}, asked: asked}
		}
	}
	r.pinMu.Unlock()
	for _, p := range pins { // outside pinMu: fencing deletes shards, which reports them
		if p.Epoch > 0 {
			r.a.learnEpoch(p.Job, p.Epoch, p.EpochStep)
		}
	}
}

// run keeps a session with the coordinator until ctx ends.
func (r *reporter) run(ctx context.Context) {
	defer r.conn.Close()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		registered, err := r.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if registered {
			backoff = 100 * time.Millisecond // a fresh outage starts from a short wait
		}
		r.a.log.Warn("coordinator session ended; reconnecting", "coordinator", r.addr, "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

var errReregister = errors.New("coordinator restarted")

func (r *reporter) session(ctx context.Context) (registered bool, err error) {
	c := r.c
	inc, err := r.register(ctx, c)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.ReportStream(ctx)
	if err != nil {
		return true, fmt.Errorf("report stream: %w", err)
	}
	defer stream.CloseSend()
	l := &link{c: c, stream: stream, inc: inc, cancel: cancel}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		batch := r.peek(512)
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return true, ctx.Err()
			case <-r.wake:
				continue
			case <-tick.C:
				// An empty report: notices a coordinator that restarted
				// (and may have lost its store) while nothing was saved.
				if err := r.send(ctx, l, []event{{}}); err != nil {
					return true, err
				}
				continue
			}
		}
		if err := r.send(ctx, l, batch); err != nil {
			return true, err
		}
		r.drop(batch[len(batch)-1].seq + 1)
	}
}

// heartbeat is how often an idle agent checks on the coordinator: a
// restarted coordinator has the agent's inventory within about this long.
const heartbeat = time.Second

// register sends the inventory. Events queued before the snapshot are
// covered by it and dropped; later ones are sent after it (duplicates are
// harmless: the coordinator ignores a report it already has).
func (r *reporter) register(ctx context.Context, c coordpb.CoordinatorClient) (string, error) {
	r.mu.Lock()
	from := r.next
	r.overflow = false
	r.mu.Unlock()
	inv, jobs := r.a.inventory()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	asked := r.ask()
	resp, err := c.Register(cctx, &coordpb.RegisterRequest{Node: &coordpb.Node{Name: r.a.cfg.Node, Addr: r.a.advertise,
		FailureDomain: r.a.cfg.FailureDomain, ShmBudgetBytes: r.a.budget}, Inventory: inv, Pins: r.told()})
	if err != nil {
		return "", fmt.Errorf("register: %w", err)
	}
	r.setPins(asked, resp.Pins)
	r.pinMu.Lock()
	clear(r.registered)
	r.pinMu.Unlock()
	if err := r.registerWriting(cctx, c, jobs); err != nil {
		return "", err
	}
	r.dropShards(from)
	r.a.log.Info("registered with coordinator", "coordinator", r.addr, "shards", len(inv), "incarnation", resp.Incarnation)
	return resp.Incarnation, nil
}

// registerWriting registers the jobs of ranks that prepared a save and
// committed nothing, for a coordinator that does not know them (one that
// lost its store). A job it knows is left as it is: such a slot may be
// stale, left by a save that died before an elastic restart changed the
// job's world size, and must not set the old size back. A live save's own
// registration is queued, and sent after this.
func (r *reporter) registerWriting(ctx context.Context, c coordpb.CoordinatorClient, jobs []*coordpb.RegisterJobRequest) error {
	for _, j := range jobs {
		_, err := c.Latest(ctx, &coordpb.LatestRequest{Job: j.Job})
		if err == nil {
			continue
		}
		if status.Code(err) == codes.Unavailable {
			// Rebuilding its index from the agents: a job it has not
			// heard of is registered by the rank's next save.
			r.a.log.Info("coordinator rebuilding; the job of a prepared save is registered by its next save", "job", j.Job, "err", err)
			continue
		}
		if status.Code(err) != codes.NotFound {
			return fmt.Errorf("register job %s: %w", j.Job, err)
		}
		if _, err := c.RegisterJob(ctx, j); err != nil {
			return fmt.Errorf("register job %s: %w", j.Job, err)
		}
	}
	return nil
}

func (r *reporter) peek(n int) []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event(nil), r.queue[:min(n, len(r.queue))]...)
}

// dropShards removes the shard events queued before seq, which the
// inventory covers; job registrations stay queued, as the inventory does
// not carry them.
func (r *reporter) dropShards(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queue = slices.DeleteFunc(r.queue, func(e event) bool { return e.seq < seq && e.job == nil })
}

// drop removes queued events with a sequence below seq.
func (r *reporter) drop(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := 0
	for i < len(r.queue) && r.queue[i].seq < seq {
		i++
	}
	r.queue = r.queue[i:]
}

// link is one session's connection to the coordinator.
type link struct {
	c      coordpb.CoordinatorClient
	stream coordpb.Coordinator_ReportStreamClient
	inc    string
	cancel context.CancelFunc // ends the session: a stuck stream is abandoned
}

// report sends one request on the stream and waits for its answer, at
// most 30 s.
func (l *link) report(req *coordpb.ReportRequest) (*coordpb.ReportResponse, error) {
	t := time.AfterFunc(30*time.Second, l.cancel)
	defer t.Stop()
	if err := l.stream.Send(req); err != nil {
		return nil, err
	}
	resp, err := l.stream.Recv()
	if err != nil {
		return nil, err
	}
	if resp.ErrorCode != 0 {
		return resp, status.Error(codes.Code(resp.ErrorCode), resp.Error)
	}
	return resp, nil
}

// send delivers a batch in order: job registrations one by one, runs of
// shard records as one report. A refusal (bad input) is logged and dropped;
// anything else ends the session so the batch is retried.
func (r *reporter) send(ctx context.Context, l *link, batch []event) error {
	for i := 0; i < len(batch); {
		var err error
		if batch[i].job != nil {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err = l.c.RegisterJob(cctx, batch[i].job)
			cancel()
			i++
		} else {
			var recs []*coordpb.ShardRecord
			for ; i < len(batch) && batch[i].job == nil; i++ {
				if batch[i].rec != nil {
					recs = append(recs, batch[i].rec)
				}
			}
			var resp *coordpb.ReportResponse
			asked := r.ask()
			resp, err = l.report(&coordpb.ReportRequest{Node: r.a.cfg.Node, Shards: recs})
			if resp != nil && resp.Incarnation != l.inc {
				return errReregister
			}
			if err == nil {
				r.setPins(asked, resp.Pins)
			}
		}
		switch status.Code(err) {
		case codes.OK:
		case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition:
			r.a.log.Error("coordinator refused a report; dropping it", "err", err)
		default:
			return err
		}
	}
	r.mu.Lock()
	over := r.overflow
	r.mu.Unlock()
	if over {
		return errReregister
	}
	return nil
}

// inventory lists every committed shard, and a registration for every rank
// that has prepared a save but committed nothing yet.
func (a *Agent) inventory() ([]*coordpb.ShardRecord, []*coordpb.RegisterJobRequest) {
	var recs []*coordpb.ShardRecord
	committed := map[rankKey]bool{}
	var jobs []*coordpb.RegisterJobRequest
	for _, sh := range a.List("") {
		switch sh.State {
		case stateCommitted:
			committed[rankKey{sh.Job, sh.Rank}] = true
			recs = append(recs, &coordpb.ShardRecord{Job: sh.Job, Step: sh.Step, Rank: sh.Rank, WorldSize: sh.WorldSize,
				Node: a.cfg.Node, SizeBytes: uint64(sh.Size), HeaderChecksum: sh.HeaderSum, State: coordpb.CopyState_COPY_STATE_COMMITTED,
				Epoch: sh.Epoch})
		case stateWriting:
			if sh.WorldSize > 0 && !committed[rankKey{sh.Job, sh.Rank}] {
				jobs = append(jobs, &coordpb.RegisterJobRequest{Job: sh.Job, WorldSize: sh.WorldSize, Placement: map[uint32]string{sh.Rank: a.cfg.Node}})
			}
		}
	}
	return recs, jobs
}

// abandoned asks the coordinator whether step of job is abandoned (a rank
// moved past it without committing it); false when it cannot tell.
func (r *reporter) abandoned(ctx context.Context, job string, step int64) bool {
	if r == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := r.c.InspectStep(ctx, &coordpb.InspectStepRequest{Job: job, Step: step, View: coordpb.StepView_STEP_VIEW_SUMMARY})
	if err != nil {
		r.a.log.Warn("cannot ask the coordinator about a step", "job", job, "step", step, "err", err)
		return false
	}
	return resp.Step.GetState() == coordpb.StepState_STEP_STATE_ABANDONED
}
