package coordinator

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

func newTestCoordinator(t testing.TB, dir string) *Coordinator {
	t.Helper()
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Logger = dir, discardLogger()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestGroupedReports: many agents report the same steps at once, as a
// synchronous job's agents do. Every step becomes consistent exactly once,
// in the answer to the report that completed it, every answer carries the
// pin as it stood after its group, refused reports are answered with their
// error without holding back the others, and what was answered consistent
// is in the store after a restart.
func TestGroupedReports(t *testing.T) {
	const nodes, perNode, steps = 64, 4, 5
	dir := filepath.Join(t.TempDir(), "store")
	c := newTestCoordinator(t, dir)
	if _, err := c.apply(func(ch *Changes) error {
		_, err := c.state.RegisterJob("j", nodes*perNode, nil, ch)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for step := range int64(steps) {
		var mu sync.Mutex
		consistent := 0
		var wg sync.WaitGroup
		for n := range nodes {
			wg.Go(func() {
				node := fmt.Sprintf("n%d", n)
				var recs []Record
				for r := n * perNode; r < (n+1)*perNode; r++ {
					recs = append(recs, Record{Job: "j", Step: step, Rank: uint32(r), WorldSize: nodes * perNode, Node: node, Size: 1, Sum: "s", State: "committed"})
				}
				res, err := c.report(node, recs)
				if err != nil {
					t.Errorf("step %d node %s: %v", step, node, err)
					return
				}
				if len(res.Pins) != 1 || res.Pins[0].Job != "j" || res.Pins[0].Step < step-1 {
					t.Errorf("step %d node %s: pins %v, want job j at step %d or later", step, node, res.Pins, step-1)
				}
				mu.Lock()
				defer mu.Unlock()
				for _, k := range res.Consistent {
					if k != (StepKey{"j", step}) {
						t.Errorf("step %d: answer says %v consistent", step, k)
					}
					consistent++
				}
			})
			if n == nodes/2 {
				wg.Go(func() {
					_, err := c.report("bad", []Record{{Job: "nope", Step: step, WorldSize: 1, Node: "bad", Sum: "s", State: "committed"}})
					if err == nil {
						t.Errorf("a report for an unknown job was accepted")
					}
				})
			}
		}
		wg.Wait()
		if consistent != 1 {
			t.Fatalf("step %d: %d answers said it became consistent, want exactly 1", step, consistent)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c2 := newTestCoordinator(t, dir)
	defer c2.Close()
	if l := c2.state.Jobs["j"].Latest; l != steps-1 {
		t.Fatalf("after a restart latest is %d, want %d", l, steps-1)
	}
}
