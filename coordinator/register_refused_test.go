package coordinator

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
)

// TestRefusedRegisterJobChangesNothing: a RegisterJob refused for any part
// of its request (replicas out of range, a policy that does not parse)
// neither creates the job nor changes a registered one: not its world
// size, placement, policy or replicas, in memory or in the store.
func TestRefusedRegisterJobChangesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	c := newTestCoordinator(t, dir)
	s := &server{c: c}
	ctx := context.Background()
	u32 := func(n uint32) *uint32 { return &n }

	for name, req := range map[string]*coordpb.RegisterJobRequest{
		"replicas 99":      {Job: "new", WorldSize: 4, Replicas: u32(99)},
		"policy ;;;":       {Job: "new", WorldSize: 4, Policy: ";;;"},
		"replicas of 2^32": {Job: "new", WorldSize: 4, Replicas: u32(1<<32 - 1)},
	} {
		if _, err := s.RegisterJob(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: RegisterJob of a new job = %v, want InvalidArgument", name, err)
		}
	}
	if _, err := s.Latest(ctx, &coordpb.LatestRequest{Job: "new"}); status.Code(err) != codes.NotFound {
		t.Fatalf("a refused RegisterJob created the job: Latest = %v", err)
	}

	if _, err := s.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "old", WorldSize: 2, Placement: map[uint32]string{0: "a", 1: "b"},
		Policy: "nvme:every=1,keep=2", Replicas: u32(1)}); err != nil {
		t.Fatal(err)
	}
	for name, req := range map[string]*coordpb.RegisterJobRequest{
		"replicas 99": {Job: "old", WorldSize: 8, Placement: map[uint32]string{0: "x"}, Policy: "nvme:every=5,keep=1", Replicas: u32(99)},
		"bad policy":  {Job: "old", WorldSize: 8, Placement: map[uint32]string{0: "x"}, Policy: "tape:every=1,keep=1", Replicas: u32(2)},
	} {
		if _, err := s.RegisterJob(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: RegisterJob = %v, want InvalidArgument", name, err)
		}
	}
	check := func(c *Coordinator, when string) {
		t.Helper()
		c.mu.Lock()
		j := c.state.Jobs["old"]
		c.mu.Unlock()
		if j == nil || j.WorldSize != 2 || j.Placement[0] != "a" || j.Placement[1] != "b" {
			t.Fatalf("%s: job after refused RegisterJobs: %+v", when, j)
		}
		if p := c.tiers.policyText("old"); p != "nvme:every=1,keep=2" {
			t.Fatalf("%s: policy after refused RegisterJobs: %s", when, p)
		}
		c.replication.mu.Lock()
		n := c.replication.replicas("old")
		c.replication.mu.Unlock()
		if n != 1 {
			t.Fatalf("%s: replicas after refused RegisterJobs: %d", when, n)
		}
	}
	check(c, "in memory")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = newTestCoordinator(t, dir)
	defer c.Close()
	check(c, "after a restart")
	c.mu.Lock()
	_, created := c.state.Jobs["new"]
	c.mu.Unlock()
	if created {
		t.Fatal("a refused RegisterJob left the job in the store")
	}
}

// TestRegisterRefusesUnsafeNodeName: an agent that registers as "../evil"
// is refused, with the rule, and is not recorded.
func TestRegisterRefusesUnsafeNodeName(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	defer c.Close()
	s := &server{c: c}
	for _, node := range []string{"../evil", "a/b", ""} {
		_, err := s.Register(context.Background(), &coordpb.RegisterRequest{Node: &coordpb.Node{Name: node, Addr: "127.0.0.1:1"}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "starting and ending with a letter or digit") {
			t.Errorf("Register as %q = %v; want InvalidArgument with the rule", node, err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.state.Nodes) != 0 {
		t.Fatalf("refused nodes recorded: %v", c.state.Nodes)
	}
}
