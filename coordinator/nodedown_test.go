package coordinator_test

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
)

// TestNodeDownOfANodeKnownOnlyByPlacement: a coordinator whose index was
// rebuilt from the agents still alive (a standby that took the lease
// after a node died) knows the dead node only from the job's placement,
// registered by the Kubernetes controller. Declaring it down must start
// the job's recovery, not answer NotFound forever (found by the
// end-to-end test of a leader killed in the middle of a recovery). A
// node named nowhere is still NotFound.
func TestNodeDownOfANodeKnownOnlyByPlacement(t *testing.T) {
	cl := &cluster{t: t, dataDir: t.TempDir()}
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, "127.0.0.1:0")
	cl.dial()
	if _, err := cl.api.RegisterJob(ctxT(t), &coordpb.RegisterJobRequest{Job: "ns.train", WorldSize: 2,
		Placement: map[uint32]string{0: "node-0", 1: "node-1"}}); err != nil {
		t.Fatal(err)
	}
	res, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1", Reason: "test"})
	if err != nil || !slices.Equal(res.Jobs, []string{"ns.train"}) {
		t.Fatalf("NodeDown(node-1) = %v, %v; want the recovery of ns.train", res, err)
	}
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-9", Reason: "test"}); status.Code(err) != codes.NotFound {
		t.Fatalf("NodeDown of a node nobody names = %v, want NotFound", err)
	}
}
