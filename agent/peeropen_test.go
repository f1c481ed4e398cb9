package agent

import (
	"context"
	"errors"
	"testing"

	"rewind.dev/rewind/api/agentpb"
)

// TestPeerOpenIsNotTheRanksRestore: during a recovery, a rank that opens
// another rank's shard as a peer reader (resharding, a DCP load) does not
// make that rank count as restored: its save is still refused until it
// opens its own shard itself.
func TestPeerOpenIsNotTheRanksRestore(t *testing.T) {
	a := epochAgent(t)
	if _, err := a.saveAsRank(t, 5, 0); err != nil {
		t.Fatal(err)
	}
	a.gang.abort("j", 5, "node lost")
	srv := &server{a: a}
	ctx := context.Background()
	prep := &agentpb.PrepareRequest{Job: "j", Rank: 0, WorldSize: 1, Step: 6, SizeBytes: 8192}
	if _, err := srv.Prepare(ctx, prep); !errors.Is(err, ErrGangBroken) {
		t.Fatalf("save before any restore: %v, want ErrGangBroken", err)
	}
	resp, err := srv.Open(ctx, &agentpb.OpenRequest{Job: "j", Rank: 0, Step: 5, Peer: true})
	if err != nil {
		t.Fatal(err)
	}
	a.Release(resp.Lease)
	if _, err := srv.Prepare(ctx, prep); !errors.Is(err, ErrGangBroken) {
		t.Fatalf("save after a peer opened the rank's shard: %v, want ErrGangBroken", err)
	}
	resp, err = srv.Open(ctx, &agentpb.OpenRequest{Job: "j", Rank: 0, Step: 5})
	if err != nil {
		t.Fatal(err)
	}
	a.Release(resp.Lease)
	if _, err := srv.Prepare(ctx, prep); err != nil {
		t.Fatalf("save after the rank restored its own shard: %v", err)
	}
}
