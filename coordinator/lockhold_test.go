package coordinator

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
)

// TestLargeJobReadsDoNotStallOthers: listing, inspecting and planning a
// restore of a job at the largest allowed world size, with as many steps
// as it may keep, do not hold the coordinator's lock long enough to stall
// another job's Latest: every Latest answers within a second (on a loaded
// machine under the race detector, the whole-job reads take far longer
// than that, so a read that held the lock throughout would show), and a
// read whose request is cancelled stops instead of finishing its work.
func TestLargeJobReadsDoNotStallOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a job of 65536 ranks")
	}
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	defer c.Close()
	s := &server{c: c}
	world := c.cfg.MaxWorldSize
	const full = 1 // the step every rank committed

	c.mu.Lock()
	var ch Changes
	placement := map[uint32]string{}
	for r := range world {
		placement[r] = fmt.Sprintf("n%d", r%64)
	}
	for _, job := range []struct {
		id        string
		world     uint32
		placement map[uint32]string
	}{{"big", world, placement}, {"small", 1, nil}} {
		if _, err := c.state.RegisterJob(job.id, job.world, job.placement, &ch); err != nil {
			c.mu.Unlock()
			t.Fatal(err)
		}
	}
	rec := func(job string, ws uint32, step int64, rank uint32) Record {
		return Record{Job: job, Step: step, Rank: rank, WorldSize: ws, Node: fmt.Sprintf("n%d", rank%64), Sum: "s", Size: 1 << 20, State: CopyCommitted}
	}
	for r := range world {
		if err := c.state.Apply(rec("big", world, full, r), &Changes{}); err != nil {
			c.mu.Unlock()
			t.Fatal(err)
		}
	}
	// Then as many steps as the job may keep, each with one rank's copy:
	// a listing walks every one of them.
	for step := int64(full + 1); step < int64(c.cfg.MaxStepsPerJob)+full; step++ {
		if err := c.state.Apply(rec("big", world, step, uint32(step)%world), &Changes{}); err != nil {
			c.mu.Unlock()
			t.Fatal(err)
		}
	}
	if err := c.state.Apply(rec("small", 1, 7, 0), &Changes{}); err != nil {
		c.mu.Unlock()
		t.Fatal(err)
	}
	steps, latest := len(c.state.Jobs["big"].Steps), c.state.Jobs["big"].Latest
	c.mu.Unlock()
	if steps != c.cfg.MaxStepsPerJob || latest != full {
		t.Fatalf("big has %d steps, latest %d", steps, latest)
	}

	ctx := context.Background()
	// The reads, each of the whole job, in turn until told to stop.
	var reads atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			var err error
			switch i % 3 {
			case 0:
				req, listed := &coordpb.ListStepsRequest{Job: "big", View: coordpb.StepView_STEP_VIEW_SUMMARY}, 0
				for page := 0; err == nil && page < steps; page++ {
					var resp *coordpb.ListStepsResponse
					if resp, err = s.ListSteps(ctx, req); err == nil {
						listed, req.PageToken = listed+len(resp.Steps), resp.NextPageToken
						if req.PageToken == "" {
							break
						}
					}
				}
				if err == nil && listed != steps {
					err = fmt.Errorf("ListSteps listed %d steps", listed)
				}
			case 1:
				req, shown := &coordpb.InspectStepRequest{Job: "big", Step: full, View: coordpb.StepView_STEP_VIEW_COPIES}, 0
				for page := 0; err == nil && page < int(world); page++ {
					var resp *coordpb.InspectStepResponse
					if resp, err = s.InspectStep(ctx, req); err == nil {
						shown, req.PageToken = shown+len(resp.Step.Copies), resp.NextPageToken
						if req.PageToken == "" {
							break
						}
					}
				}
				if err == nil && shown != int(world) {
					err = fmt.Errorf("InspectStep showed %d copies", shown)
				}
			case 2:
				var plan *coordpb.PlanRestoreResponse
				if plan, err = c.PlanRestore(ctx, "big", -1); err == nil && (plan.Step != full || len(plan.Ranks) != int(world) ||
					plan.Ranks[world-1].TargetNode != placement[world-1] || len(plan.Ranks[world-1].Sources) != 1) {
					err = fmt.Errorf("PlanRestore planned step %d, %d ranks, the last %v", plan.Step, len(plan.Ranks), plan.Ranks[len(plan.Ranks)-1])
				}
			}
			if err != nil {
				errc <- err
				return
			}
			reads.Add(1)
		}
	})
	// Latest of the other job, again and again, until every kind of read
	// ran at least twice.
	var slowest time.Duration
	var asked int
	for reads.Load() < 6 {
		select {
		case err := <-errc:
			t.Fatal(err)
		default:
		}
		start := time.Now()
		resp, err := s.Latest(ctx, &coordpb.LatestRequest{Job: "small"})
		took := time.Since(start)
		if err != nil || resp.Step != 7 {
			t.Fatalf("Latest of small: %v %v", resp, err)
		}
		slowest, asked = max(slowest, took), asked+1
		time.Sleep(time.Millisecond) // let the reads take the lock between asks
	}
	close(stop)
	wg.Wait()
	t.Logf("%d reads of big; the slowest of %d Latest of small took %v", reads.Load(), asked, slowest)
	if slowest > time.Second {
		t.Errorf("Latest of another job waited %v behind reads of a job of %d ranks and %d steps", slowest, world, steps)
	}

	// A read whose request is over stops.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.ListSteps(done, &coordpb.ListStepsRequest{Job: "big"}); status.Code(err) != codes.Canceled {
		t.Errorf("ListSteps with its request cancelled = %v, want Canceled", err)
	}
	if _, err := c.PlanRestore(done, "big", -1); err == nil {
		t.Error("PlanRestore with its request cancelled planned anyway")
	}
}
