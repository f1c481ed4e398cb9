package coordinator

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"rewind.dev/rewind/internal/clock"
)

// rebuildCase is a coordinator's catching up (rebuild.go), stepped on a
// fake clock: a store that knows nodes (a stale standby's) or none, agents
// registering with the steps they were told, and what Latest may answer.
type rebuildCase struct {
	leader bool             // began to lead (Config.Leading) rather than restarted on its store
	known  []string         // nodes the loaded index knows
	steps  []int64          // steps of job "j" every rank of every known node has (consistent)
	regs   []rebuildReg     // registrations, in order
	after  time.Duration    // then the clock steps this far
	want   map[string]error // job -> what rebuildingLocked says at the end (nil: answers)
}

// rebuildReg is an agent's registration: its node and the latest step of
// job "j" it was told (-1: none), applying inventory for steps.
type rebuildReg struct {
	node  string
	told  int64
	steps []int64
}

func TestRebuildRules(t *testing.T) {
	const grace = 10 * time.Second
	for name, tc := range map[string]rebuildCase{
		"restart on its store: no wait": {
			known: []string{"a", "b"}, steps: []int64{5},
			want: map[string]error{"j": nil, "": nil},
		},
		"restart on its store: an agent told a newer step waits for it": {
			known: []string{"a", "b"}, steps: []int64{5},
			regs: []rebuildReg{{node: "a", told: 6}},
			want: map[string]error{"j": ErrRebuilding, "": ErrRebuilding},
		},
		"restart on its store: the floor reached": {
			known: []string{"a"}, steps: []int64{5},
			regs: []rebuildReg{{node: "a", told: 6, steps: []int64{6}}},
			want: map[string]error{"j": nil},
		},
		"restart on its store: a floor for a job it does not know is ignored": {
			regs: []rebuildReg{{node: "a", told: 3}},
			want: map[string]error{"nope": nil, "": nil},
		},
		"new leader: waits for the nodes of its index": {
			leader: true, known: []string{"a", "b"}, steps: []int64{5},
			regs: []rebuildReg{{node: "a", told: 5}},
			want: map[string]error{"j": ErrRebuilding, "": ErrRebuilding},
		},
		"new leader: every node registered": {
			leader: true, known: []string{"a", "b"}, steps: []int64{5},
			regs: []rebuildReg{{node: "a", told: 5, steps: []int64{5}}, {node: "b", told: 5, steps: []int64{5}}},
			want: map[string]error{"j": nil, "": nil},
		},
		"new leader knowing no node: waits LeaveGrace": {
			leader: true, regs: []rebuildReg{{node: "a", told: -1}},
			want: map[string]error{"j": ErrRebuilding, "": ErrRebuilding},
		},
		"new leader knowing no node: answers after LeaveGrace": {
			leader: true, regs: []rebuildReg{{node: "a", told: -1, steps: []int64{2}}}, after: grace,
			want: map[string]error{"j": nil, "": nil},
		},
		"a node that never comes back: the nodes' wait ends, the floor's goes on": {
			leader: true, known: []string{"a", "b"}, steps: []int64{5},
			regs: []rebuildReg{{node: "a", told: 7}}, after: grace,
			want: map[string]error{"j": ErrRebuilding},
		},
		"a node that never comes back: the floor's wait ends with absent nodes": {
			leader: true, known: []string{"a", "b"}, steps: []int64{5},
			regs: []rebuildReg{{node: "a", told: 7}}, after: absentAfter * grace,
			want: map[string]error{"j": nil, "": nil},
		},
	} {
		t.Run(name, func(t *testing.T) { runRebuild(t, tc, grace) })
	}
}

func runRebuild(t *testing.T, tc rebuildCase, grace time.Duration) {
	clk := clock.NewFake(time.Unix(1000, 0))
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Clock, cfg.LeaveGrace = t.TempDir(), clk, grace
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if tc.leader {
		cfg.Leading = func() bool { return true }
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	inventory := func(node string, steps []int64) []Record {
		var recs []Record
		for _, s := range steps {
			recs = append(recs, Record{Job: "j", Step: s, Rank: 0, WorldSize: 1, Node: node, Size: 1, Sum: "s", State: CopyCommitted})
		}
		return recs
	}
	c.mu.Lock()
	for _, n := range tc.known { // the loaded index
		c.state.Nodes[n] = &NodeInfo{Name: n}
		var ch Changes
		if len(tc.steps) > 0 {
			if _, err := c.state.RegisterJob("j", 1, nil, &ch); err != nil {
				t.Fatal(err)
			}
		}
		for _, r := range inventory(n, tc.steps) {
			if err := c.state.Apply(r, &ch); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.mu.Unlock()
	for _, reg := range tc.regs {
		told := map[string]int64{"j": reg.told, "nope": reg.told}
		if _, err := c.Register(&NodeInfo{Name: reg.node}, inventory(reg.node, reg.steps), told); err != nil {
			t.Fatal(err)
		}
	}
	clk.Step(tc.after)
	c.mu.Lock()
	defer c.mu.Unlock()
	for job, want := range tc.want {
		if got := c.rebuildingLocked(job); !errors.Is(got, want) || (want == nil) != (got == nil) {
			t.Errorf("job %q: %v, want %v", job, got, want)
		}
	}
}
