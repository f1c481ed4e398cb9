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
	"time"

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
// reopened.
func Follow(ctx context.Context, api coordpb.CoordinatorClient, job string, d Driver, observe func(*coordpb.JobEvent)) error {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		stream, err := api.WatchJob(ctx, &coordpb.WatchJobRequest{Job: job})
		for err == nil {
			var ev *coordpb.JobEvent
			if ev, err = stream.Recv(); err != nil {
				break
			}
			backoff = 100 * time.Millisecond
			var rerr error
			if ev.Kind == "regang" && ev.Ok {
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
