package coordinator_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
)

// TestOperatorRestartGoesBack: an operator restores step 3 of a job whose
// latest consistent step is 4 and restarts it there. Without force the
// restart is refused (it would delete step 4) and nothing changes; a dry
// run names the steps it would delete; with force the job resumes from
// step 3: step 4 is gone, every rank's shard of step 3 is in its node's
// memory bit-identical, the job's watchers get a regang event that says
// who asked, and the ranks' next saves of step 4 make a clean step 4 (no
// mix with the old one).
func TestOperatorRestartGoesBack(t *testing.T) {
	const job, ws = "goback", 2
	cl := newCluster(t, 2)
	cl.saveSteps(job, ws, 4, 0, 1)
	req := &coordpb.PlanRestoreRequest{Job: job, Step: 3, Restart: true, RequestedBy: "alice"}
	_, err := cl.api.PlanRestore(ctxT(t), req)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "later consistent steps [4]") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("restart to an older step without force: %v", err)
	}
	req.Force, req.DryRun = true, true
	plan, err := cl.api.PlanRestore(ctxT(t), req)
	if err != nil || plan.Executed || plan.Restarted || !slices.Equal(plan.DroppedSteps, []int64{4}) {
		t.Fatalf("dry run: %v %v", plan, err)
	}
	cl.waitLatest(job, 4) // nothing changed

	events := cl.watch(job)
	req.DryRun = false
	plan, err = cl.api.PlanRestore(ctxT(t), req)
	if err != nil || !plan.Executed || !plan.Ok || !plan.Restarted || plan.Step != 3 || !slices.Equal(plan.DroppedSteps, []int64{4}) {
		t.Fatalf("restart: %v %v", plan, err)
	}
	ev := nextEvent(t, events)
	if !ev.Ok || ev.Kind != coordpb.JobEventKind_JOB_EVENT_KIND_REGANG || ev.Step != 3 || ev.Node != "" || !strings.Contains(ev.Reason, "operator restore of step 3 asked by alice") ||
		ev.Placement[0] != "node-0" || ev.Placement[1] != "node-1" {
		t.Fatalf("event: %v", ev)
	}
	cl.waitLatest(job, 3)
	if _, err := cl.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: 4}); err == nil {
		t.Fatal("step 4 is still in the index after going back to step 3")
	}
	for r := range uint32(ws) {
		s, _ := cl.clients[r].Session(job, r, ws)
		// The event comes once the agents' order streams took the resume;
		// each agent ends the break when it reads it, a moment later.
		wait.ForNil(t, 10*time.Second, fmt.Sprintf("rank %d's agent to end the break", r), func() error {
			_, _, err := s.LatestConsistent(ctxT(t))
			return err
		})
		got, err := s.Restore(ctxT(t))
		if err != nil || got.Step != 3 || !bytes.Equal(got.Tensors[0].Data, rankData(3, r)) {
			t.Fatalf("rank %d restores %v (%v), want step 3", r, got, err)
		}
	}
	cl.saveStep(job, ws, 4, 0, 1)
	cl.waitLatest(job, 4)
	v, err := cl.api.VerifyStep(ctxT(t), &coordpb.StepRequest{Job: job, Step: 4})
	if err != nil || !v.Ok {
		t.Fatalf("the new step 4: %v %v", v, err)
	}
}

// TestRankPullsItsShardOnDemand: a rank starts on a node whose memory
// does not hold its shard (Kubernetes put its new pod there before any
// restore did): its restore asks the agent, the agent asks the
// coordinator where the shard lives and fetches it, verified. A step that
// is not restorable stays a clear not-found.
func TestRankPullsItsShardOnDemand(t *testing.T) {
	const job, ws = "pull", 2
	cl := newCluster(t, 3) // rank 0 on node-0, rank 1 on node-1, node-2 holds nothing
	cl.saveStep(job, ws, 1, 0, 1)
	cl.waitLatest(job, 1)
	s, err := cl.clients[2].Session(job, 1, ws)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Restore(ctxT(t))
	if err != nil || got.Step != 1 || !bytes.Equal(got.Tensors[0].Data, rankData(1, 1)) {
		t.Fatalf("rank 1 restoring on node-2, which did not hold its shard: %v %v", got, err)
	}
	shards, err := cl.clients[2].List(ctxT(t), job)
	if err != nil || len(shards) != 1 || shards[0].Rank != 1 || shards[0].Step != 1 {
		t.Fatalf("node-2's memory after the pull: %v %v", shards, err)
	}
	if _, err := s.RestoreStep(ctxT(t), 7); !errors.Is(err, sdk.ErrNotFound) || !strings.Contains(err.Error(), "step 7") {
		t.Fatalf("restore of a step that does not exist: %v", err)
	}
}
