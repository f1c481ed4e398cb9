package agent_test

import (
	"bytes"
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/testcluster"
)

// TestStagedRestoreSwitchesOrFrees: a restore's fetch with a stage leaves
// the shard staged, verified but neither served nor the rank's
// checkpoint; asked again it stages nothing more. Finishing the restore
// without commit frees the slot (the node's memory is as before);
// finishing it with commit makes the shard the rank's checkpoint,
// bit-identical. A node that already holds the shard stages nothing.
func TestStagedRestoreSwitchesOrFrees(t *testing.T) {
	_, receiver, ps := peerPair(t, nil)
	ctx := context.Background()
	src := []agent.Source{{Tier: "shm", Node: ps.Node, Addr: ps.Addr}}
	stage := func(id string) {
		t.Helper()
		p := ps
		p.Stage = id
		res, err := receiver.Agent.FetchFrom(ctx, p, src)
		if err != nil || !res.Staged || res.Tier != "shm:holder" {
			t.Fatalf("staged fetch %s: %+v %v", id, res, err)
		}
		if st, _ := stateAt(receiver.Agent, 1); st != "staged" {
			t.Fatalf("after a staged fetch the slot is %q", st)
		}
	}
	stage("a")
	stage("a") // asked again: the slot staged already
	if n := len(receiver.Agent.List("peer")); n != 1 {
		t.Fatalf("%d slots after the same stage twice", n)
	}
	if _, _, err := receiver.Agent.Open("peer", 0, 1, false); err == nil {
		t.Fatal("a staged shard was served")
	}
	if _, _, err := receiver.Agent.Open("peer", 0, 0, true); err == nil {
		t.Fatal("a staged shard is the rank's latest checkpoint")
	}
	if n, err := receiver.Agent.FinishRestore("peer", "b", true); err != nil || n != 0 {
		t.Fatalf("finishing another restore: %d %v", n, err)
	}
	if n, err := receiver.Agent.FinishRestore("peer", "a", false); err != nil || n != 1 {
		t.Fatalf("dropping the restore: %d %v", n, err)
	}
	if st, _ := stateAt(receiver.Agent, 1); st != "" {
		t.Fatalf("after the restore was dropped the slot is %q", st)
	}

	stage("c")
	if n, err := receiver.Agent.FinishRestore("peer", "c", true); err != nil || n != 1 {
		t.Fatalf("switching to the restore: %d %v", n, err)
	}
	if st, _ := stateAt(receiver.Agent, 1); st != "committed" {
		t.Fatalf("after the switch the slot is %q", st)
	}
	s, _ := testcluster.Dial(t, receiver.Config.Socket).Session("peer", 0, 1)
	got, err := s.RestoreStep(ctx, 1)
	if err != nil || !bytes.Equal(got.Tensor("w").Data, stateOf(0, 1)[0].Data) {
		t.Fatalf("restore after the switch: %v", err)
	}
	p := ps
	p.Stage = "d"
	if res, err := receiver.Agent.FetchFrom(ctx, p, src); err != nil || res.Staged {
		t.Fatalf("a staged fetch of a shard held committed: %+v %v, want nothing staged", res, err)
	}
}

// TestStagedFetchNoSourceAnswers: a staged fetch that no source serves is
// an answer naming every source and why (what the coordinator marks the
// copies and the step from), not an error; each failure is classified.
func TestStagedFetchNoSourceAnswers(t *testing.T) {
	cfg := testcluster.AgentConfig(t)
	testcluster.StartAgent(t, cfg)
	conn, err := grpc.NewClient("unix://"+cfg.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := agentpb.NewAgentClient(conn).Fetch(context.Background(), &agentpb.FetchRequest{Job: "j", Rank: 0, Step: 5, WorldSize: 2,
		SizeBytes: 8192, HeaderChecksum: "x", Stage: "s", Sources: []*agentpb.FetchSource{{Tier: "shm", Node: "peer"}, {Tier: "pfs", Node: "-"}}})
	if err != nil || resp.Tier != "" || resp.Staged || len(resp.Failed) != 2 {
		t.Fatalf("staged fetch with no source: %v %v", resp, err)
	}
	for _, f := range resp.Failed {
		if f.Failure != agentpb.FetchFailure_FETCH_FAILURE_UNAVAILABLE || f.Error == "" {
			t.Errorf("attempt %s: %s %q, want unavailable with a reason", f.Tier, f.Failure.Label(), f.Error)
		}
	}
}
