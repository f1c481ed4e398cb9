package localcluster_test

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/internal/localcluster"
	"rewind.dev/rewind/internal/testcluster"
)

// TestAgentStartsWhenItsPortIsTaken: the port a node was given is taken
// by another process before its agent binds it (two test packages' local
// clusters on one machine): the agent starts on fresh ports, and the node
// says which.
func TestAgentStartsWhenItsPortIsTaken(t *testing.T) {
	bin := testcluster.Binary(t, "rewind.dev/rewind/cmd/rewind")
	c, err := localcluster.New(localcluster.Options{Rewind: bin, Name: "ports", ShmDir: "/dev/shm"})
	t.Cleanup(func() { c.Close(false) })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.StartCoordinator(ctx, "", nil); err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	n := c.NewNode("node-0", "rack-a", true)
	n.Listen = taken.Addr().String()
	c.Nodes = append(c.Nodes, n)
	if err := c.StartAgent(ctx, n, nil, nil); err != nil {
		t.Fatalf("starting an agent whose port is taken: %v", err)
	}
	if n.Listen == taken.Addr().String() {
		t.Fatalf("the agent kept the taken address %s", n.Listen)
	}
	log, err := os.ReadFile(n.Log)
	if err != nil || strings.Count(string(log), "address already in use") != 1 {
		t.Fatalf("the agent's log should say once that its port was taken: %v\n%s", err, log)
	}
}
