package coordinator

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/agentpb"
)

// TestCallsToANodeDeclaredDown: a call in flight to a node that answers
// nothing (a frozen node: its kernel accepts the connection, nothing
// more) ends when the node is declared down; later calls to it are not
// made until it comes back; then they are again.
func TestCallsToANodeDeclaredDown(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { c.Close() })
	frozen, err := net.Listen("tcp", "127.0.0.1:0") // never accepts: the kernel completes the handshakes
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.Close()
	c.mu.Lock()
	c.state.Nodes["n"] = &NodeInfo{Name: "n", Addr: frozen.Addr().String()}
	c.mu.Unlock()
	status := func(ctx context.Context) error {
		return c.agentCall(ctx, "n", func(ctx context.Context, a agentpb.AgentClient) error {
			_, err := a.Status(ctx, &agentpb.StatusRequest{}, grpc.WaitForReady(true))
			return err
		})
	}

	inFlight := make(chan error, 1)
	go func() { inFlight <- status(context.Background()) }()
	select {
	case err := <-inFlight:
		t.Fatalf("a call to a frozen node returned before its death: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := c.nodeDown("n", "test", false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-inFlight:
		if !errors.Is(err, errNodeDeclaredDown) {
			t.Fatalf("the call in flight ended with %v, want the node's death", err)
		}
	case <-time.After(20 * time.Second): // its own bound is AgentTimeout, two minutes
		t.Fatal("the call in flight to the frozen node did not end at its death")
	}
	if err := status(context.Background()); !errors.Is(err, errNodeDeclaredDown) {
		t.Fatalf("a call to the node declared down: %v, want it not made", err)
	}

	c.nodeUp("n")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := status(ctx); errors.Is(err, errNodeDeclaredDown) || err == nil {
		t.Fatalf("a call to the node come back: %v, want it made (and unanswered)", err)
	}
}
