package coordinator_test

import (
	"slices"
	"testing"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
)

// TestARestoreDuringAStoreOutageMarksNothing: the object store is the only
// copy of every step left (every node lost its memory), and it is down
// when a restore runs. The restore cannot bring a step back, but nothing
// is wrong with the steps: once the store is up again, the next restore
// must restore the newest step, not pass over the steps the outage made
// unreadable as if they were lost.
func TestARestoreDuringAStoreOutageMarksNothing(t *testing.T) {
	const job = "outage"
	tc := newTierCluster(t, 2, "s3:every=1,keep=3", nil)
	tc.saveDurable(job, 3, "s3")
	tc.restartAgents(job, 2, 3)
	if err := tc.minio.Stop(); err != nil {
		t.Fatal(err)
	}
	plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, RequestedBy: "test"})
	if err == nil && plan.Ok {
		t.Fatalf("restore with the object store down: %v", plan)
	}
	t.Logf("restore with the object store down: %v %v", plan, err)
	if err := tc.minio.Start(); err != nil {
		t.Fatal(err)
	}
	plan, err = tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, RequestedBy: "test"})
	if err != nil || !plan.Ok || plan.Step != 3 || len(plan.Skipped) != 0 {
		t.Fatalf("restore once the object store is back: %v %v, want step 3 restored with none passed over", plan, err)
	}
	tc.checkRestoredAt(job, 3, map[uint32]int{0: 0, 1: 1})
}

// saveDurable saves steps 1 to last of a 2-rank job, rank r on node-r,
// each step waited for until consistent and its copy on tier done.
func (tc *tierCluster) saveDurable(job string, last int64, tier string) {
	tc.t.Helper()
	for step := int64(1); step <= last; step++ {
		tc.saveStep(job, 2, step, 0, 1)
		tc.waitLatest(job, step)
		tc.waitStarted(job, step, []string{tier})
		tc.waitTiers(job)
	}
}

// TestARecoveryDuringAStoreOutageKeepsTheSurvivingCopies: node-0 dies
// while the object store, the only other holder of rank 0's steps, is
// down. The recovery cannot restore, and must not fall back either: a
// fallback discards the steps after the older one on every node, so
// rank 1's newest step in node-1's memory would go, for a step that
// restores once the store is back. Nor may it stall after its tries (2
// here): no node coming back would start it again. Once MinIO is up, a
// retry of the recovery re-gangs the job at the newest step.
func TestARecoveryDuringAStoreOutageKeepsTheSurvivingCopies(t *testing.T) {
	const job = "outage-recovery"
	const tries = 2
	tc := newTierCluster(t, 3, "s3:every=1,keep=3", nil, func(c *coordinator.Config) { c.RecoveryRetries = tries })
	tc.saveDurable(job, 3, "s3")
	if err := tc.minio.Stop(); err != nil {
		t.Fatal(err)
	}
	events := tc.watch(job)
	tc.agents[0].Stop()
	if _, err := tc.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-0", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, events); ev.Ok {
		t.Fatalf("recovery with the object store down: %v, want it failed", ev)
	}
	shards, err := tc.clients[1].List(ctxT(t), job)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(shards, func(s *agentpb.Shard) bool { return s.Rank == 1 && s.Step == 3 }) {
		t.Fatalf("node-1 after the failed recovery holds %v, want rank 1's step 3 still", shards)
	}
	for failed := 1; failed < tries+2; failed++ { // past the tries: retried still
		ev := nextEvent(t, events)
		t.Logf("event %d: ok %v step %d reason %q err %.200s", failed, ev.Ok, ev.Step, ev.Reason, ev.Error)
		if ev.Ok {
			t.Fatalf("recovery %d with the object store down: %v, want it failed", failed+1, ev)
		}
	}
	if err := tc.minio.Start(); err != nil {
		t.Fatal(err)
	}
	for {
		ev := nextEvent(t, events)
		if !ev.Ok {
			continue // a retry before MinIO answered
		}
		if ev.Step != 3 {
			t.Fatalf("recovery once MinIO is back: %v, want a re-gang at step 3", ev)
		}
		break
	}
	tc.checkRestoredAt(job, 3, map[uint32]int{0: 2, 1: 1})
}
