package coordinator_test

import (
	"fmt"
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/shm"
)

// TestStaleWritingSlotKeepsNewWorldSize: a save that died between Prepare
// and Commit leaves its slot "writing" at the job's old world size. After
// an elastic restart registered the job with a new size, the agent holding
// that slot reconnects (here, to a restarted coordinator): the job keeps
// the new size, and the new gang's saves still land.
func TestStaleWritingSlotKeepsNewWorldSize(t *testing.T) {
	cl := newCluster(t, 1)
	ctx := ctxT(t)
	if _, err := cl.agents[0].Agent.Prepare(ctx, "el", 0, 2, 3, shm.Alignment); err != nil {
		t.Fatal(err)
	}
	cl.waitWorldSize("el", 2)
	// The elastic restart: the new gang (4 ranks) registers the job.
	if _, err := cl.api.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "el", WorldSize: 4}); err != nil {
		t.Fatal(err)
	}
	// The coordinator restarts on its store: the agent registers again,
	// with the stale slot in its inventory.
	cl.stop()
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, cl.addr)
	// A save of another job is reported after the agent's registration.
	cl.saveStep("probe", 1, 1, 0)
	cl.waitLatest("probe", 1)
	cl.waitWorldSize("el", 4)
	cl.saveStep("el", 4, 5, 0)
	steps, err := cl.api.ListSteps(ctx, &coordpb.ListStepsRequest{Job: "el"})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range steps.Steps {
		if st.Step == 5 && st.WorldSize != 4 {
			t.Fatalf("the new gang's step 5 was recorded at world size %d", st.WorldSize)
		}
	}
}

// waitWorldSize waits until the coordinator has job at world size ws.
func (cl *cluster) waitWorldSize(job string, ws uint32) {
	cl.t.Helper()
	wait.ForNil(cl.t, 10*time.Second, fmt.Sprintf("job %s at world size %d", job, ws), func() error {
		jobs, err := cl.api.ListJobs(ctxT(cl.t), &coordpb.ListJobsRequest{})
		if err != nil {
			return err
		}
		for _, j := range jobs.Jobs {
			if j.Id == job && j.WorldSize != ws {
				return fmt.Errorf("world size %d", j.WorldSize)
			}
			if j.Id == job {
				return nil
			}
		}
		return fmt.Errorf("no job %s", job)
	})
}
