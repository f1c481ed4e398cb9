package coordinator

import (
	"fmt"
	"maps"
	"testing"
	"time"
)

func TestGrowPlacement(t *testing.T) {
	four := map[uint32]string{0: "a", 1: "a", 2: "c", 3: "c"}
	for _, tc := range []struct {
		name   string
		from   map[uint32]string
		spares []string
		full   uint32
		want   map[uint32]string
	}{
		{"a spare takes as many ranks as each node runs", four, []string{"b"}, 6,
			map[uint32]string{0: "a", 1: "a", 2: "c", 3: "c", 4: "b", 5: "b"}},
		{"no more than the full size", four, []string{"b", "d"}, 6,
			map[uint32]string{0: "a", 1: "a", 2: "c", 3: "c", 4: "b", 5: "b"}},
		{"two spares", four, []string{"b", "d"}, 8,
			map[uint32]string{0: "a", 1: "a", 2: "c", 3: "c", 4: "b", 5: "b", 6: "d", 7: "d"}},
		{"no spare", four, nil, 6, nil},
		{"uneven ranks per node: no size for a new node", map[uint32]string{0: "a", 1: "a", 2: "c"}, []string{"b"}, 6, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := growPlacement(tc.from, tc.spares, tc.full)
			if ok != (tc.want != nil) || !maps.Equal(got, tc.want) {
				t.Fatalf("got %v %v, want %v", got, ok, tc.want)
			}
		})
	}
}

func TestShrinkPlacement(t *testing.T) {
	two := map[uint32]string{0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
	for _, tc := range []struct {
		name    string
		down    []string
		spares  []string
		want    map[uint32]string
		shrinks bool
	}{
		{"a lost node, no spare: its ranks dropped, the rest numbered anew", []string{"b"}, nil,
			map[uint32]string{0: "a", 1: "a", 2: "c", 3: "c"}, true},
		{"the first node lost", []string{"a"}, nil, map[uint32]string{0: "b", 1: "b", 2: "c", 3: "c"}, true},
		{"a spare takes the lost node whole: no shrink", []string{"b"}, []string{"d"}, nil, false},
		{"two lost, one spare: the first goes to the spare, the second is dropped", []string{"a", "c"}, []string{"d"},
			map[uint32]string{0: "d", 1: "d", 2: "b", 3: "b"}, true},
		{"nothing lost", nil, nil, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			down := func(n string) bool {
				for _, d := range tc.down {
					if d == n {
						return true
					}
				}
				return false
			}
			got, ok := shrinkPlacement(two, down, tc.spares)
			if ok != tc.shrinks || !maps.Equal(got, tc.want) {
				t.Fatalf("got %v %v, want %v %v", got, ok, tc.want, tc.shrinks)
			}
		})
	}
}

// TestDroppedCopies: of a job shrunk from six ranks to four, whose
// protected step 3 was saved by the four, the copies freed are exactly
// those in live nodes' memory of ranks 4 and 5 of the older steps: not
// ranks 0 to 3, not tier copies, not copies on a node declared down,
// each once; none while the protected step is the six's, nor on a
// coordinator that does not lead.
func TestDroppedCopies(t *testing.T) {
	c := newTestCoordinator(t, t.TempDir())
	defer c.Close()
	mem := func(rank uint32, nodes ...string) []*Copy {
		var out []*Copy
		for _, n := range nodes {
			out = append(out, &Copy{Rank: rank, Node: n, Tier: "shm", Sum: "s"})
		}
		return out
	}
	step := func(n int64, ws uint32, copies map[uint32][]*Copy) *Step {
		return &Step{Job: "j", Step: n, WorldSize: ws, State: Consistent, Copies: copies}
	}
	j := &Job{ID: "j", WorldSize: 4, Latest: 3, Protected: 3, Steps: map[int64]*Step{
		1: step(1, 6, map[uint32][]*Copy{0: mem(0, "n0"), 3: mem(3, "n2"),
			4: append(mem(4, "n0", "down"), &Copy{Rank: 4, Node: "n0", Tier: "s3"}), 5: mem(5, "n2")}),
		2: step(2, 6, map[uint32][]*Copy{1: mem(1, "n2"), 4: mem(4, "n2"), 5: mem(5, "n0", "n2")}),
		3: step(3, 4, map[uint32][]*Copy{0: mem(0, "n0"), 1: mem(1, "n2"), 2: mem(2, "n0"), 3: mem(3, "n2")}),
	}}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state.Jobs["j"] = j
	c.down["down"] = time.Now()
	got := map[string]bool{}
	for _, k := range c.droppedCopiesLocked(j) {
		got[fmt.Sprintf("step %d rank %d on %s", k.step, k.rank, k.node)] = true
	}
	want := map[string]bool{"step 1 rank 4 on n0": true, "step 1 rank 5 on n2": true,
		"step 2 rank 4 on n2": true, "step 2 rank 5 on n0": true, "step 2 rank 5 on n2": true}
	if !maps.Equal(got, want) {
		t.Fatalf("dropped copies %v, want %v", got, want)
	}
	if again := c.droppedCopiesLocked(j); len(again) != 0 {
		t.Fatalf("copies being deleted asked for again: %v", again)
	}
	clear(c.dropping)
	j.Steps[3].WorldSize = 6 // the protected step is the old gang's: the new gang still needs them
	if early := c.droppedCopiesLocked(j); len(early) != 0 {
		t.Fatalf("freed before the new gang's step was protected: %v", early)
	}
	j.Steps[3].WorldSize = 4
	c.cfg.Leading = func() bool { return false }
	if follower := c.droppedCopiesLocked(j); len(follower) != 0 {
		t.Fatalf("a coordinator that does not lead freed %v", follower)
	}
}
