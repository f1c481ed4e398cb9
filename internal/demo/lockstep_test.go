package demo

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/testcluster"
)

// TestTrainersSurviveAFailedSave: two ranks train in lockstep; one save of
// one rank fails (an injected fault before its commit). That step can
// never become consistent (it is abandoned), yet no other save fails: the
// other rank's agent reuses the slot of its abandoned step rather than
// keep it beside the consistent one, and both ranks finish every step.
func TestTrainersSurviveAFailedSave(t *testing.T) {
	coord := testcluster.StartCoordinator(t, testcluster.CoordinatorConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	in := faultinject.New(nil, 1)
	if err := in.Set("agent/shard-copied=2*off->1*error(EIO)"); err != nil { // the third commit fails
		t.Fatal(err)
	}
	cfg := testcluster.AgentConfig(t)
	cfg.CoordinatorAddr, cfg.Faults = coord.Addr, in
	cfg.Logger = testcluster.Discard()
	testcluster.StartAgent(t, cfg)

	const steps = 6
	outs := make([]strings.Builder, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range uint32(2) {
		wg.Go(func() {
			tc := DefaultTrainConfig()
			tc.Socket, tc.Job, tc.Rank, tc.World = cfg.Socket, "lockstep", r, 2
			tc.Steps, tc.Size, tc.StepTime, tc.Out = steps, MinSize, 10*time.Millisecond, &outs[r]
			errs[r] = Train(ctx, tc)
		})
	}
	wg.Wait()
	failed := 0
	for r := range 2 {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v\n%s", r, errs[r], outs[r].String())
		}
		if !strings.Contains(outs[r].String(), "done step 6") {
			t.Fatalf("rank %d did not finish:\n%s", r, outs[r].String())
		}
		failed += strings.Count(outs[r].String(), "save failed")
	}
	if failed != 1 || in.Hits()[faultinject.AgentShardCopied] != 1 {
		t.Logf("rank 0:\n%s\nrank 1:\n%s", outs[0].String(), outs[1].String())
		t.Fatalf("%d saves failed, fault fired %d times; want one", failed, in.Hits()[faultinject.AgentShardCopied])
	}
}
