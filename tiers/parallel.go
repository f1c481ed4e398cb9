package tiers

import (
	"context"
	"sync"
	"sync/atomic"
)

// parallel runs do(ctx, w, i) for every i in [0, n) on at most workers
// goroutines, each with the state setup returns (given back to release
// when the goroutine ends). The first error, from setup or do, stops the
// hand-out of work, cancels the ctx the other calls see, and is returned
// once every goroutine has ended. do checks ctx itself where it wants to
// stop early; parallel returns nil when ctx ends and no do failed, so the
// caller reports the cancellation in its own words.
func parallel[W any](ctx context.Context, workers int, n int64, setup func() (W, func(), error), do func(ctx context.Context, w W, i int64) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		once  sync.Once
		first error
		stop  atomic.Bool
	)
	fail := func(err error) {
		once.Do(func() { first = err })
		stop.Store(true)
		cancel()
	}
	for range min(int64(workers), max(n, 1)) {
		wg.Go(func() {
			w, release, err := setup()
			if err != nil {
				fail(err)
				return
			}
			if release != nil {
				defer release()
			}
			for {
				i := next.Add(1) - 1
				if i >= n || stop.Load() {
					return
				}
				if err := do(ctx, w, i); err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// noState is the setup of workers that keep no state of their own.
func noState() (struct{}, func(), error) { return struct{}{}, nil, nil }
