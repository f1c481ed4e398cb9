package coordinator_test

import (
	"testing"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/testcluster"
)

// A rank that saves its step again with the same bytes (a save retried
// after its commit's answer was lost, or a rank restarted in place) holds
// two copies the coordinator knows as one. Whichever of the two slots
// goes, the step must stay the job's latest consistent step, restorable,
// while the other holds it.

const twinJob = "twice"

// saveTwice saves step 1 of a one-rank job twice, into the rank's two
// slots.
func saveTwice(t *testing.T) *cluster {
	cl := newCluster(t, 1)
	cl.saveSteps(twinJob, 1, 1, 0)
	cl.saveStep(twinJob, 1, 1, 0) // the same bytes again, into the second slot
	return cl
}

// takeASlot prepares step 2, which takes the slot a rotation gives up,
// and goes no further; then it checks step 1 is still the latest and
// restores it.
func takeASlot(t *testing.T, cl *cluster) {
	t.Helper()
	if _, err := cl.clients[0].API().Prepare(ctxT(t), &agentpb.PrepareRequest{Job: twinJob, Rank: 0, WorldSize: 1, Step: 2, SizeBytes: 8192}); err != nil {
		t.Fatal(err)
	}
	// The agent reports in order: once another job's step is consistent,
	// what the Prepare reported has been applied.
	cl.saveSteps("after", 1, 1, 0)
	resp, err := cl.api.Latest(ctxT(t), &coordpb.LatestRequest{Job: twinJob})
	if err != nil || resp.Step != 1 {
		t.Fatalf("latest consistent step of a step saved twice, once a slot of it was taken: %d (%v), want 1", resp.GetStep(), err)
	}
	s, err := cl.clients[0].Session(twinJob, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.RestoreStep(ctxT(t), 1); err != nil {
		t.Fatalf("restoring step 1 from its other copy: %v", err)
	}
}

// TestSavedTwiceStaysLatest: the save of step 2 takes the older slot (two
// slots per rank; the newer copy of step 1 is the latest).
func TestSavedTwiceStaysLatest(t *testing.T) {
	takeASlot(t, saveTwice(t))
}

// TestSavedTwiceNewerCorrupt: the newer copy is found corrupt; the older
// is good. The coordinator drops the node's copy whatever its checksum:
// the agent tells it of the good one again, and the save of step 2, which
// takes the corrupt slot first, must not take the good copy with it.
func TestSavedTwiceNewerCorrupt(t *testing.T) {
	cl := saveTwice(t)
	api := cl.clients[0].API()
	open, err := api.Open(ctxT(t), &agentpb.OpenRequest{Job: twinJob, Rank: 0, Step: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Release(ctxT(t), &agentpb.ReleaseRequest{Lease: open.Lease}); err != nil {
		t.Fatal(err)
	}
	testcluster.Flip(t, open.Shard.Path, -100) // the newer copy's tensor bytes
	if v, err := api.Verify(ctxT(t), &agentpb.VerifyRequest{Job: twinJob, Rank: 0, Step: 1}); err != nil || v.Ok {
		t.Fatalf("verifying the flipped copy: %v, %v", v, err)
	}
	takeASlot(t, cl)
}
