package demo

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
)

// TestElasticResumeKeepsACheckpointItCannotRead: the job has a consistent
// step, but it lacks a tensor the model restores (a model renamed since,
// a save of another program): the rank fails, naming the tensor, rather
// than start afresh and save over the checkpoint.
func TestElasticResumeKeepsACheckpointItCannotRead(t *testing.T) {
	coord := testcluster.StartCoordinator(t, testcluster.CoordinatorConfig(t))
	cfg := testcluster.AgentConfig(t)
	cfg.CoordinatorAddr, cfg.Logger = coord.Addr, testcluster.Discard()
	testcluster.StartAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const job = "renamed"
	sess, err := testcluster.Dial(t, cfg.Socket).Session(job, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	st := newSharded(elasticRows(MinSize), 0, 1)
	st.step = 3
	tensors, objects := st.parts()
	if err := sess.Save(ctx, 3, tensors[:1], objects); err != nil { // "w" only
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "step 3 consistent", func() bool {
		step, ok, err := sess.LatestConsistent(ctx)
		return err == nil && ok && step == 3
	})

	var out strings.Builder
	tc := DefaultTrainConfig()
	tc.Job, tc.Rank, tc.World, tc.Size, tc.Out = job, 0, 1, MinSize, &out
	_, err = resumeElastic(ctx, sess, tc)
	if err == nil || !strings.Contains(err.Error(), `"v"`) || strings.Contains(out.String(), "fresh") {
		t.Fatalf("resume from a step without tensor v: %v, printed %q; want an error naming v, not a fresh start", err, out.String())
	}
	if !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("resume error %v: want the SDK's ErrNotFound kept", err)
	}
}
