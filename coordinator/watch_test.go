package coordinator_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/regang"
)

// recorder is a re-gang driver that notes the steps it was handed.
type recorder struct {
	mu    sync.Mutex
	steps []int64
	got   chan struct{}
}

func (r *recorder) Regang(_ context.Context, ev *coordpb.JobEvent) error {
	r.mu.Lock()
	r.steps = append(r.steps, ev.Step)
	r.mu.Unlock()
	select {
	case r.got <- struct{}{}:
	default:
	}
	return nil
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.steps)
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
	go regang.Follow(ctx, api, job, before, nil)
	time.Sleep(100 * time.Millisecond) // the first watch is open
	api.cut()

	cl.agents[1].Stop()
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	cl.waitLatest(job, 2)
	time.Sleep(200 * time.Millisecond) // the recovery is published
	api.heal()
	select {
	case <-before.got:
	case <-time.After(20 * time.Second):
		t.Fatal("the follower whose stream was down never got the recovery")
	}

	// Started after the recovery: Follow does not act on it,
	// FollowReplaying does, once.
	after, replaying := &recorder{got: make(chan struct{}, 4)}, &recorder{got: make(chan struct{}, 4)}
	go regang.Follow(ctx, cl.api, job, after, nil)
	go regang.FollowReplaying(ctx, cl.api, job, replaying, nil)
	select {
	case <-replaying.got:
	case <-time.After(20 * time.Second):
		t.Fatal("FollowReplaying never got the last recovery")
	}
	time.Sleep(300 * time.Millisecond)
	if n := before.count(); n != 1 {
		t.Errorf("the reconnected follower re-ganged %d times, want once", n)
	}
	if n := after.count(); n != 0 {
		t.Errorf("a follower started after the recovery re-ganged %d times, want none", n)
	}
	if n := replaying.count(); n != 1 {
		t.Errorf("FollowReplaying re-ganged %d times, want once", n)
	}
}

// breakable is a coordinator client whose WatchJob streams can be cut:
// while cut, open streams fail and new ones are refused.
type breakable struct {
	coordpb.CoordinatorClient
	mu     sync.Mutex
	down   bool
	cancel []context.CancelFunc
}

func (b *breakable) WatchJob(ctx context.Context, req *coordpb.WatchJobRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[coordpb.JobEvent], error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return nil, status.Error(codes.Unavailable, "cut by the test")
	}
	ctx, cancel := context.WithCancel(ctx)
	b.cancel = append(b.cancel, cancel)
	return b.CoordinatorClient.WatchJob(ctx, req, opts...)
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
