package regang

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"rewind.dev/rewind/api/coordpb"
)

func TestNodeRegangRunsOnlyItsRanks(t *testing.T) {
	var mu sync.Mutex
	var started []string
	l := script{
		"0@-1": "sleep 30",                    // node a's first rank, stuck in a broken collective
		"0@9":  "sleep 30", "2@9": "sleep 30", // after the recovery node a runs ranks 0 and 2
	}.local(t, &started, &mu)
	defer l.KillAll()
	if err := l.Start(map[uint32]string{0: "a"}, 1, -1); err != nil {
		t.Fatal(err)
	}
	n := &Node{Name: "a", Local: l}
	ev := &coordpb.JobEvent{Step: 9, Placement: map[uint32]string{0: "a", 1: "b", 2: "a"}}
	if err := n.Regang(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	if got := l.Running(); !slices.Equal(got, []uint32{0, 2}) {
		t.Fatalf("running after the regang: %v, want [0 2]", got)
	}
	mu.Lock()
	got := strings.Join(started, ", ")
	mu.Unlock()
	if got != "0@-1 on a, 0@9 on a, 2@9 on a" {
		t.Fatalf("started: %s", got)
	}
	l.Kill(2)
	if got := l.Running(); !slices.Equal(got, []uint32{0}) {
		t.Fatalf("running after killing rank 2: %v, want [0]", got)
	}
	// An event that places nothing here leaves nothing running.
	if err := n.Regang(context.Background(), &coordpb.JobEvent{Step: 12, Placement: map[uint32]string{0: "b", 1: "b", 2: "c"}}); err != nil {
		t.Fatal(err)
	}
	if got := l.Running(); len(got) != 0 {
		t.Fatalf("running after an event placing nothing here: %v", got)
	}
}

func TestOnNode(t *testing.T) {
	p := map[uint32]string{0: "a", 1: "b", 2: "a", 3: "c"}
	got := OnNode(p, "a")
	if len(got) != 2 || got[0] != "a" || got[2] != "a" {
		t.Fatalf("OnNode(a) = %v", got)
	}
	if len(OnNode(p, "z")) != 0 || len(OnNode(nil, "a")) != 0 {
		t.Fatal("a node without ranks got some")
	}
}
