// Package regang restarts a job's ranks after the coordinator recovered
// it. The coordinator decides: which step, which rank runs on which node,
// and it has every rank's shard put in that node's shared memory before
// it says so. What restarts the processes depends on how the job runs: a
// Driver. Local runs the ranks as processes of this machine (tests, the
// demo); the Kubernetes MPIJob driver comes with its own package.
package regang

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/coordpb"
)

// Driver restarts a job's ranks on a recovery's placement, each resuming
// from the recovery's step.
type Driver interface {
	Regang(ctx context.Context, ev *coordpb.JobEvent) error
}

// Attempts at one recovery's re-gang, and the first wait between them
// (doubling up to regangMaxWait): about half a minute in all.
var (
	regangAttempts = 8
	regangWait     = 250 * time.Millisecond
	regangMaxWait  = 8 * time.Second
)

// regangRetrying hands ev to d until it succeeds, ctx ends or the attempts
// run out. A recovery is delivered once: the coordinator does not replay
// it to a watcher that reconnects, so a driver's transient failure (an
// API server that timed out, a conflict) must not drop it. Drivers are
// idempotent for one event.
func regangRetrying(ctx context.Context, d Driver, ev *coordpb.JobEvent) error {
	wait := regangWait
	var err error
	for attempt := 1; ; attempt++ {
		if err = d.Regang(ctx, ev); err == nil || attempt >= regangAttempts || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, regangMaxWait)
	}
}

// Follow watches job's recoveries on the coordinator and hands each
// successful one to d, in order, until ctx ends; observe, when not nil,
// sees every event (a failed recovery included) once d has acted on it.
// A driver that fails is tried again with backoff; a broken stream is
// reopened, and a recovery published while it was down is replayed. A
// recovery from before the follow began is not.
func Follow(ctx context.Context, api coordpb.CoordinatorClient, job string, d Driver, observe func(*coordpb.JobEvent)) error {
	return follow(ctx, api, job, d, observe, false)
}

// FollowReplaying is Follow that also gets the job's last recovery from
// before the follow began, if the coordinator (since it started) has
// made one: for a driver that starts after the coordinator may have acted
// (a new leader's controller) and is idempotent for one event.
func FollowReplaying(ctx context.Context, api coordpb.CoordinatorClient, job string, d Driver, observe func(*coordpb.JobEvent)) error {
	return follow(ctx, api, job, d, observe, true)
}

func follow(ctx context.Context, api coordpb.CoordinatorClient, job string, d Driver, observe func(*coordpb.JobEvent), replayFirst bool) error {
	backoff := 100 * time.Millisecond
	var seen uint64 // the last event handled, or the coordinator's last when the first watch began
	watched := false
	for ctx.Err() == nil {
		stream, err := api.WatchJob(ctx, &coordpb.WatchJobRequest{Job: job, Replay: watched || replayFirst, AfterSeq: seen})
		if err == nil && !watched {
			watched = true
			if !replayFirst {
				seen = max(seen, headerSeq(stream))
			}
		}
		for err == nil {
			var ev *coordpb.JobEvent
			if ev, err = stream.Recv(); err != nil {
				break
			}
			backoff = 100 * time.Millisecond
			if ev.Seq != 0 && ev.Seq <= seen {
				continue // handled before the stream broke
			}
			seen = max(seen, ev.Seq)
			var rerr error
			if ev.Kind == coordpb.JobEventKind_JOB_EVENT_KIND_REGANG && ev.Ok {
				rerr = regangRetrying(ctx, d, ev)
			}
			if observe != nil {
				observe(ev)
			}
			if rerr != nil {
				return fmt.Errorf("regang: job %s step %d: %w", job, ev.Step, rerr)
			}
		}
		if errors.Is(err, io.EOF) || ctx.Err() != nil {
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	return ctx.Err()
}

// headerSeq returns the seq a WatchJob stream's header names, 0 if none.
func headerSeq(stream grpc.ServerStreamingClient[coordpb.JobEvent]) uint64 {
	md, err := stream.Header()
	if err != nil {
		return 0
	}
	v := md.Get(coordpb.EventSeqHeader)
	if len(v) != 1 {
		return 0
	}
	n, _ := strconv.ParseUint(v[0], 10, 64)
	return n
}
