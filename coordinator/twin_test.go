package coordinator_test

import (
	"testing"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
)

// TestSavedTwiceStaysLatest: a rank that saves its step again with the
// same bytes (a save retried after its commit's answer was lost, or a
// rank restarted in place) holds two copies the coordinator knows as one.
// The next save takes the older slot: the step must stay the job's latest
// consistent step, restorable, while the newer copy holds it.
func TestSavedTwiceStaysLatest(t *testing.T) {
	cl := newCluster(t, 1)
	const job = "twice"
	cl.saveSteps(job, 1, 1, 0)
	cl.saveStep(job, 1, 1, 0) // the same bytes again, into the second slot
	// The save of step 2 takes the first copy's slot (two slots per rank;
	// the newer copy of step 1 is the latest) and goes no further.
	if _, err := cl.clients[0].API().Prepare(ctxT(t), &agentpb.PrepareRequest{Job: job, Rank: 0, WorldSize: 1, Step: 2, SizeBytes: 8192}); err != nil {
		t.Fatal(err)
	}
	// The agent reports in order: once another job's step is consistent,
	// what the Prepare reported has been applied.
	cl.saveSteps("after", 1, 1, 0)
	resp, err := cl.api.Latest(ctxT(t), &coordpb.LatestRequest{Job: job})
	if err != nil || resp.Step != 1 {
		t.Fatalf("latest consistent step of a step saved twice, once its older slot was taken: %d (%v), want 1", resp.GetStep(), err)
	}
	s, err := cl.clients[0].Session(job, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.RestoreStep(ctxT(t), 1); err != nil {
		t.Fatalf("restoring step 1 from its newer copy: %v", err)
	}
}
