package regang

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"rewind.dev/rewind/api/coordpb"
)

// oneEvent is a coordinator whose WatchJob stream delivers one recovery
// and then stays open: what a follower sees of one node's loss. Only
// WatchJob is called by Follow.
type oneEvent struct {
	coordpb.CoordinatorClient
	ev *coordpb.JobEvent
}

func (c oneEvent) WatchJob(ctx context.Context, _ *coordpb.WatchJobRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[coordpb.JobEvent], error) {
	return &eventStream{ctx: ctx, evs: []*coordpb.JobEvent{c.ev}}, nil
}

type eventStream struct {
	ctx context.Context
	evs []*coordpb.JobEvent
}

func (s *eventStream) Recv() (*coordpb.JobEvent, error) {
	if len(s.evs) > 0 {
		ev := s.evs[0]
		s.evs = s.evs[1:]
		return ev, nil
	}
	<-s.ctx.Done()
	return nil, s.ctx.Err()
}

func (s *eventStream) Header() (metadata.MD, error) { return nil, nil }
func (s *eventStream) Trailer() metadata.MD         { return nil }
func (s *eventStream) CloseSend() error             { return nil }
func (s *eventStream) Context() context.Context     { return s.ctx }
func (s *eventStream) SendMsg(any) error            { return nil }
func (s *eventStream) RecvMsg(any) error            { return nil }

// flaky fails its first fails re-gangs, then succeeds.
type flaky struct {
	mu    sync.Mutex
	fails int
	calls []int64
	done  chan struct{}
}

func (d *flaky) Regang(_ context.Context, ev *coordpb.JobEvent) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, ev.Step)
	if len(d.calls) <= d.fails {
		return errors.New("the API server timed out")
	}
	close(d.done)
	return nil
}

// TestFollowRetriesAFailedRegang: the coordinator delivers a recovery
// once (a watcher that reconnects does not get it again), so a driver's
// transient failure must be retried, not end the follow and lose it.
func TestFollowRetriesAFailedRegang(t *testing.T) {
	regangWait = 10 * time.Millisecond
	d := &flaky{fails: 2, done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- Follow(ctx, oneEvent{ev: &coordpb.JobEvent{Job: "j", Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Ok: true, Step: 7}}, "j", d, nil)
	}()
	select {
	case <-d.done:
	case err := <-errc:
		t.Fatalf("Follow returned %v before the re-gang succeeded (calls %v)", err, d.calls)
	case <-ctx.Done():
		t.Fatalf("the re-gang never succeeded: calls %v", d.calls)
	}
	d.mu.Lock()
	calls := d.calls
	d.mu.Unlock()
	if len(calls) != 3 || calls[0] != 7 || calls[2] != 7 {
		t.Fatalf("re-gang calls %v, want step 7 three times", calls)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Follow ended with %v after its context was cancelled", err)
	}
}
