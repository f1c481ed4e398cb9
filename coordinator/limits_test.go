package coordinator

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
)

// TestLimitsRefuseBeforeAnyChange: a registration or report that would
// take the index over one of its limits (world size, jobs, steps per job,
// copies per shard) is refused with an error naming the limit's flag, and
// the index is as it was.
func TestLimitsRefuseBeforeAnyChange(t *testing.T) {
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	defer c.Close()
	s := &server{c: c}
	ctx := context.Background()

	_, err := s.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "big", WorldSize: 1<<32 - 1})
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != "coordinator: job big: world size 4294967295 is over the limit of 65536 (--max-world-size)" {
		t.Fatalf("RegisterJob at world size 2^32-1 = %v", err)
	}
	if _, err := s.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "big", WorldSize: 65536}); err != nil {
		t.Fatalf("RegisterJob at the limit: %v", err)
	}
	if _, err := s.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "big", WorldSize: 65537, Placement: map[uint32]string{0: "n"}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("re-registration over the limit = %v", err)
	}
	c.mu.Lock()
	j := c.state.Jobs["big"]
	if len(c.state.Jobs) != 1 || j.WorldSize != 65536 || len(j.Placement) != 0 {
		t.Errorf("after refused registrations: %d jobs, big at world size %d placed %v", len(c.state.Jobs), j.WorldSize, j.Placement)
	}
	c.mu.Unlock()

	// The other limits, on an index with small ones.
	st := NewState(time.Now)
	st.limits = Limits{WorldSize: 8, Jobs: 2, StepsPerJob: 3, CopiesPerShard: 2}
	var ch Changes
	for _, job := range []string{"a", "b"} {
		if _, err := st.RegisterJob(job, 2, nil, &ch); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(what string, err error, kind error, flag string) {
		t.Helper()
		var le *LimitError
		if !errors.As(err, &le) || !errors.Is(err, kind) || !strings.Contains(err.Error(), "(--"+flag+")") {
			t.Errorf("%s: %v; want a limit error naming --%s", what, err, flag)
		}
	}
	ch = Changes{}
	_, err = st.RegisterJob("c", 2, nil, &ch)
	refused("a third job", err, ErrRefused, "max-jobs")
	if _, err := st.RegisterJob("a", 2, map[uint32]string{0: "n0"}, &ch); err != nil {
		t.Errorf("a known job at the job limit: %v", err)
	}
	commit := func(step int64, rank uint32, node string) error {
		return st.Apply(Record{Job: "a", Step: step, Rank: rank, WorldSize: 2, Node: node, Sum: "s", Size: 1, State: CopyCommitted}, &Changes{})
	}
	for step := int64(1); step <= 3; step++ {
		if err := commit(step, 0, "n0"); err != nil {
			t.Fatal(err)
		}
	}
	refused("a fourth step", commit(4, 0, "n0"), ErrRefused, "max-steps-per-job")
	if err := commit(3, 1, "n1"); err != nil {
		t.Errorf("a known step at the step limit: %v", err)
	}
	if err := commit(3, 1, "n2"); err != nil {
		t.Fatal(err)
	}
	refused("a third copy", commit(3, 1, "n3"), ErrRefused, "max-copies-per-shard")
	if err := commit(3, 1, "n2"); err != nil {
		t.Errorf("a copy replacing one at the copy limit: %v", err)
	}
	j = st.Jobs["a"]
	if len(st.Jobs) != 2 || len(j.Steps) != 3 || j.Steps[4] != nil || len(j.Steps[3].Copies[1]) != 2 || j.Latest != 3 {
		t.Errorf("after refused reports: %d jobs, steps %d, copies of step 3 rank 1 %d, latest %d", len(st.Jobs), len(j.Steps), len(j.Steps[3].Copies[1]), j.Latest)
	}
}
