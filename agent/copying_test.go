package agent_test

import (
	"context"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
)

// TestSaveLeavesACopyInProgress: while the agent copies a shard of a rank
// in from a peer (a restore staging it; a replica, a tier pull likewise),
// a save of that rank (its old gang still running while the job is
// re-ganged) takes another slot, not the one being written, which a save
// takes over only from an abandoned save: the restore's copy completes.
func TestSaveLeavesACopyInProgress(t *testing.T) {
	in := faultinject.New(nil, 1)
	if err := in.Set("agent/replica-received=1*sleep(1s)"); err != nil {
		t.Fatal(err)
	}
	_, receiver, ps := peerPair(t, func(cfg *agent.Config) { cfg.Faults = in })
	ctx := context.Background()
	ps.Stage = "restore"
	type fetched struct {
		res agent.FetchResult
		err error
	}
	done := make(chan fetched, 1)
	go func() {
		res, err := receiver.Agent.FetchFrom(ctx, ps, []agent.Source{{Tier: "shm", Node: ps.Node, Addr: ps.Addr}})
		done <- fetched{res, err}
	}()
	wait.For(t, 10*time.Second, "the copy's first bytes to arrive", func() bool { return in.Hits()[faultinject.AgentReplicaReceived] > 0 })
	s, err := testcluster.Dial(t, receiver.Config.Socket).Session("peer", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(ctx, 2, stateOf(0, 2), nil); err != nil {
		t.Fatalf("a save beside the copy: %v", err)
	}
	f := <-done
	if f.err != nil || !f.res.Staged {
		t.Fatalf("the copy a save ran beside: %+v %v, want it staged", f.res, f.err)
	}
	if st, _ := stateAt(receiver.Agent, 1); st != "staged" {
		t.Fatalf("the copied shard is %q, want staged", st)
	}
}

// TestReplicaLeavesASaveInProgress: a replica of a rank copied in from a
// peer (the step before, replicated to the node where a new gang placed
// the rank) while the rank's own save of the next step is being written
// takes another slot: the save's slot stays the save's.
func TestReplicaLeavesASaveInProgress(t *testing.T) {
	_, receiver, ps := peerPair(t, nil)
	ctx := context.Background()
	prep, err := receiver.Agent.Prepare(ctx, "peer", 0, 1, 2, ps.Size)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := receiver.Agent.CopyFromPeer(ctx, ps, nil); err != nil {
		t.Fatalf("the replica beside the save: %v", err)
	}
	var saving, replica bool
	for _, sh := range receiver.Agent.List("peer") {
		switch {
		case sh.Step == 2 && sh.Slot == prep.Slot && sh.State == "writing":
			saving = true
		case sh.Step == 1 && sh.Slot != prep.Slot && sh.State == "committed":
			replica = true
		}
	}
	if !saving || !replica {
		t.Fatalf("after a replica copied in beside a save: the save's slot %d still writing: %t, the replica committed in another: %t",
			prep.Slot, saving, replica)
	}
}
