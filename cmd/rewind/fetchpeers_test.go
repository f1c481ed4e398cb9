package main

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/transport"
)

// TestFetchDialsOnlyKnownNodes: a process on the node's socket asks the
// agent (a real process, with mutual TLS, registered with a real
// coordinator) to fetch a shard from a node the coordinator never
// registered, and from the registered node n2 at an address that is not
// n2's. Both are refused PermissionDenied naming the node and the
// address, before anything is dialed, and the agent's log has them as
// audit lines. n2 at its registered address passes the check.
func TestFetchDialsOnlyKnownNodes(t *testing.T) {
	c := startSecureCluster(t)
	conn, err := transport.NewUnixClient(c.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	api := agentpb.NewAgentClient(conn)
	const n2Addr = "127.0.0.1:9" // discard: nothing answers
	if _, err := c.client(t, filepath.Join("node", "n2")).Register(ctxT(t), &coordpb.RegisterRequest{Node: &coordpb.Node{Name: "n2", Addr: n2Addr}}); err != nil {
		t.Fatal(err)
	}
	// The agent isolates jobs: the caller presents job j's token, as a
	// rank of it does (the SDK puts it in every call's metadata).
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "rewind-job-token", jobToken(t, c.certs, "j"))
	fetch := func(node, addr string) error {
		_, err := api.Fetch(ctx, &agentpb.FetchRequest{Job: "j", Rank: 0, Step: 1, WorldSize: 1, SizeBytes: 4096, HeaderChecksum: "x",
			Sources: []*agentpb.FetchSource{{Tier: "shm", Node: node, Addr: addr}}})
		return err
	}
	for name, tc := range map[string]struct {
		node, addr string
		says       []string
	}{
		"an unknown node":               {"intruder", "10.1.2.3:22", []string{`"intruder"`, "10.1.2.3:22", "coordinator knows"}},
		"a known node, another address": {"n2", "10.1.2.3:7070", []string{`"n2"`, "10.1.2.3:7070", n2Addr}},
	} {
		t.Run(name, func(t *testing.T) {
			err := fetch(tc.node, tc.addr)
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("got %v, want PermissionDenied", err)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the refusal %q does not name %s", err, s)
				}
			}
		})
	}
	if err := fetch("n2", n2Addr); status.Code(err) == codes.PermissionDenied {
		t.Errorf("a fetch from n2 at its registered address was refused: %v", err)
	}
	if out := c.agent.out.String(); !strings.Contains(out, "msg=audit") || !strings.Contains(out, "Agent/Fetch") || !strings.Contains(out, "code=PermissionDenied") {
		t.Errorf("no audit line of the refused Fetch in the agent's log")
	}
}
