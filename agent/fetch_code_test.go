package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/testcluster"
)

// TestFetchNoSourceIsNotFound: a Fetch that no source serves answers
// NotFound, with a one-line message naming every source tried and why,
// whatever the sources' own errors wrap (a source this node has no tier
// for, a peer with no address: invalid on their own) — not
// InvalidArgument with a message that says "not found". A request that
// is itself invalid is InvalidArgument, and one its caller cancelled is
// that, not a missing shard.
func TestFetchNoSourceIsNotFound(t *testing.T) {
	cfg := testcluster.AgentConfig(t)
	r := testcluster.StartAgent(t, cfg)
	conn, err := grpc.NewClient("unix://"+cfg.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := agentpb.NewAgentClient(conn)
	ctx := context.Background()

	for name, tc := range map[string]struct {
		ctx  context.Context
		req  *agentpb.FetchRequest
		code codes.Code
		want []string
	}{
		"sources that cannot serve": {ctx: ctx, code: codes.NotFound,
			req: &agentpb.FetchRequest{Job: "j", Rank: 0, Step: 5, WorldSize: 2, SizeBytes: 8192, HeaderChecksum: "x",
				Sources: []*agentpb.FetchSource{{Tier: "shm", Node: "peer"}, {Tier: "pfs", Node: "-"}}},
			want: []string{"no source could restore job j rank 0 step 5 (2 tried)", "shm:peer: ", "no address for node peer", "; pfs:-: ", `no tier "pfs"`}},
		"tiers this node lacks": {ctx: ctx, code: codes.NotFound,
			req:  &agentpb.FetchRequest{Job: "j", Rank: 0, Step: 5, Tiers: []string{"pfs"}},
			want: []string{"no tier could restore job j rank 0", "pfs: "}},
		"an invalid request": {ctx: ctx, code: codes.InvalidArgument,
			req:  &agentpb.FetchRequest{Job: "../j", Rank: 0, Step: 5, WorldSize: 2, Sources: []*agentpb.FetchSource{{Tier: "shm", Node: "peer"}}},
			want: []string{"job"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := c.Fetch(tc.ctx, tc.req)
			st := status.Convert(err)
			if st.Code() != tc.code {
				t.Fatalf("Fetch = %v, want code %v", err, tc.code)
			}
			msg := st.Message()
			if tc.code != codes.NotFound && strings.HasPrefix(msg, "not found") {
				t.Errorf("a %v answer says %q", st.Code(), msg)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("message spans lines: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
		})
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = r.Agent.FetchFrom(canceled, agent.PeerShard{Job: "j", Rank: 0, WorldSize: 2, Step: 5, Size: 8192, HeaderSum: "x"},
		[]agent.Source{{Tier: "shm", Node: "peer"}, {Tier: "pfs", Node: "-"}})
	if !errors.Is(err, context.Canceled) || errors.Is(err, agent.ErrNotFound) {
		t.Fatalf("FetchFrom with its context cancelled = %v, want context.Canceled", err)
	}
}
