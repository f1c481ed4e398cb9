package coordinator_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/regang"
)

// recorder is a re-gang driver that notes the events it was handed (Regang)
// and every event its follower saw (observe).
type recorder struct {
	mu       sync.Mutex
	reganged []uint64 // seqs
	seen     uint64   // the last seq observed
	got      chan struct{}
}

func (r *recorder) Regang(_ context.Context, ev *coordpb.JobEvent) error {
	r.mu.Lock()
	r.reganged = append(r.reganged, ev.Seq)
	r.mu.Unlock()
	select {
	case r.got <- struct{}{}:
	default:
	}
	return nil
}

func (r *recorder) observe(ev *coordpb.JobEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = max(r.seen, ev.Seq)
}

// count is how many times the driver was handed the event seq.
func (r *recorder) count(seq uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.reganged {
		if s == seq {
			n++
		}
	}
	return n
}

func (r *recorder) saw(seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen >= seq
}

// TestFollowGetsARecoveryMadeWhileItsStreamWasDown: a recovery is
// published once. A follower whose stream was down then (a coordinator
// restart, a network blip) gets it replayed when it reconnects, once; a
// follower that starts after it does not get it (Follow), unless it asks
// (FollowReplaying, the Kubernetes controller of a new leader).
func TestFollowGetsARecoveryMadeWhileItsStreamWasDown(t *testing.T) {
	const job, ws = "replay", 2
	cl := rackCluster(t, 1)
	cl.saveSteps(job, ws, 2, 0, 1)
	waitReplicas(t, cl, job, 2, ws, 2)

	// A follower watching before the recovery, whose stream is cut
	// while it happens: its API client fails every call until healed.
	api := &breakable{CoordinatorClient: cl.api}
	before := &recorder{got: make(chan struct{}, 4)}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go regang.Follow(ctx, api, job, before, before.observe)
	wait.For(t, 10*time.Second, "the follower's first watch open on the coordinator", func() bool { return api.opened.Load() >= 1 })
	api.cut()

	cl.agents[1].Stop()
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	recovery, err := cl.lastEvent(job)
	if err != nil || !recovery.Ok || recovery.Kind != coordpb.JobEventKind_JOB_EVENT_KIND_REGANG {
		t.Fatalf("the recovery's event: %v %v", recovery, err)
	}
	api.heal()
	select {
	case <-before.got:
	case <-time.After(20 * time.Second):
		t.Fatal("the follower whose stream was down never got the recovery")
	}

	// Started after the recovery: Follow does not act on it,
	// FollowReplaying does, once.
	afterAPI := &breakable{CoordinatorClient: cl.api}
	after, replaying := &recorder{got: make(chan struct{}, 4)}, &recorder{got: make(chan struct{}, 4)}
	go regang.Follow(ctx, afterAPI, job, after, after.observe)
	go regang.FollowReplaying(ctx, cl.api, job, replaying, replaying.observe)
	select {
	case <-replaying.got:
	case <-time.After(20 * time.Second):
		t.Fatal("FollowReplaying never got the last recovery")
	}
	wait.For(t, 10*time.Second, "the late follower's watch open on the coordinator", func() bool { return afterAPI.opened.Load() >= 1 })

	// One more event (rank 1's new node dies too; with no spare, its
	// recovery fails), seen by every follower after the first: by then
	// each has acted on the recovery as many times as it ever will.
	var i int
	if _, err := fmt.Sscanf(recovery.Placement[1], "node-%d", &i); err != nil {
		t.Fatal(err)
	}
	cl.agents[i].Stop()
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: recovery.Placement[1], Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*recorder{"reconnected": before, "late": after, "replaying": replaying} {
		wait.For(t, 20*time.Second, "the "+name+" follower to see the event after the recovery", func() bool { return r.saw(recovery.Seq + 1) })
	}
	if n := before.count(recovery.Seq); n != 1 {
		t.Errorf("the reconnected follower re-ganged %d times, want once", n)
	}
	if n := after.count(recovery.Seq); n != 0 {
		t.Errorf("a follower started after the recovery re-ganged %d times, want none", n)
	}
	if n := replaying.count(recovery.Seq); n != 1 {
		t.Errorf("FollowReplaying re-ganged %d times, want once", n)
	}
}

// breakable is a coordinator client whose WatchJob streams can be cut:
// while cut, open streams fail and new ones are refused. opened counts
// the streams whose header came: the coordinator has subscribed them.
type breakable struct {
	coordpb.CoordinatorClient
	mu     sync.Mutex
	down   bool
	cancel []context.CancelFunc
	opened atomic.Int32
}

func (b *breakable) WatchJob(ctx context.Context, req *coordpb.WatchJobRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[coordpb.JobEvent], error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return nil, status.Error(codes.Unavailable, "cut by the test")
	}
	ctx, cancel := context.WithCancel(ctx)
	b.cancel = append(b.cancel, cancel)
	stream, err := b.CoordinatorClient.WatchJob(ctx, req, opts...)
	if err != nil {
		return nil, err
	}
	return &countedStream{ServerStreamingClient: stream, opened: &b.opened}, nil
}

// countedStream counts, in opened, its header's arrival.
type countedStream struct {
	grpc.ServerStreamingClient[coordpb.JobEvent]
	opened *atomic.Int32
	once   sync.Once
}

func (s *countedStream) Header() (metadata.MD, error) {
	md, err := s.ServerStreamingClient.Header()
	if err == nil {
		s.once.Do(func() { s.opened.Add(1) })
	}
	return md, err
}

func (s *countedStream) Recv() (*coordpb.JobEvent, error) {
	ev, err := s.ServerStreamingClient.Recv()
	if err == nil { // a header came before the first event
		s.once.Do(func() { s.opened.Add(1) })
	}
	return ev, err
}

func (b *breakable) cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = true
	for _, c := range b.cancel {
		c()
	}
	b.cancel = nil
}

func (b *breakable) heal() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = false
}
