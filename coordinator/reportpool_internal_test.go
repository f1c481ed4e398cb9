package coordinator

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"rewind.dev/rewind/api/coordpb"
)

// TestConcurrentReportsKeepTheirRecords: many agents Report (through the server, so
// through the record pool) the same steps at once, with deletions of an
// older step and refused records mixed in. Under -race, any read of a
// report's records after Report put them back (the leader of a group, the
// pins, replication) would be a race with the next report that takes the
// slice from the pool and refills it.
func TestConcurrentReportsKeepTheirRecords(t *testing.T) {
	const nodes, perNode, steps = 48, 3, 30
	const ws = nodes * perNode
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	defer c.Close()
	s := &server{c: c}
	if _, err := c.apply(func(ch *Changes) error {
		_, err := c.state.RegisterJob("j", ws, nil, ch)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for step := range int64(steps) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		consistent := 0
		for n := range nodes {
			wg.Go(func() {
				node := fmt.Sprintf("n%d", n)
				req := &coordpb.ReportRequest{Node: node}
				for r := n * perNode; r < (n+1)*perNode; r++ {
					req.Shards = append(req.Shards, &coordpb.ShardRecord{Job: "j", Step: step, Rank: uint32(r), WorldSize: ws, Node: node,
						SizeBytes: uint64(r + 1), HeaderChecksum: fmt.Sprintf("s%d-%d", step, r), State: coordpb.CopyState_COPY_STATE_COMMITTED})
					if step >= 3 {
						req.Shards = append(req.Shards, &coordpb.ShardRecord{Job: "j", Step: step - 3, Rank: uint32(r), WorldSize: ws, Node: node,
							HeaderChecksum: fmt.Sprintf("s%d-%d", step-3, r), State: coordpb.CopyState_COPY_STATE_DELETED})
					}
				}
				if n%7 == 0 { // refused record in the same report
					req.Shards = append(req.Shards, &coordpb.ShardRecord{Job: "nope", Step: step, WorldSize: 1, Node: node, HeaderChecksum: "x",
						State: coordpb.CopyState_COPY_STATE_COMMITTED})
				}
				resp, err := s.Report(ctx, req)
				if err != nil {
					t.Errorf("step %d %s: %v", step, node, err)
					return
				}
				if len(resp.Pins) != 1 || resp.Pins[0].Job != "j" {
					t.Errorf("step %d %s: pins %v", step, node, resp.Pins)
				}
				mu.Lock()
				defer mu.Unlock()
				for _, k := range resp.Consistent {
					if k.Job != "j" || k.Step != step {
						t.Errorf("step %d: answer says %v consistent", step, k)
					}
					consistent++
				}
			})
			if n%5 == 0 { // wholly refused reports, answered with an error
				wg.Go(func() {
					_, err := s.Report(ctx, &coordpb.ReportRequest{Node: "bad", Shards: []*coordpb.ShardRecord{{Job: "nope", Step: step, WorldSize: 1,
						Node: "bad", HeaderChecksum: "x", State: coordpb.CopyState_COPY_STATE_COMMITTED}}})
					if err == nil {
						t.Errorf("a report for an unknown job was accepted")
					}
				})
			}
		}
		wg.Wait()
		if consistent != 1 {
			t.Fatalf("step %d: %d answers said consistent", step, consistent)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.state.Jobs["j"]
	if j.Latest != steps-1 {
		t.Fatalf("latest %d, want %d", j.Latest, steps-1)
	}
	for st, stp := range j.Steps {
		for r, cs := range stp.Copies {
			for _, cp := range cs {
				if want := fmt.Sprintf("s%d-%d", st, r); cp.Sum != want || cp.Size != uint64(r+1) || cp.Node != fmt.Sprintf("n%d", r/perNode) {
					t.Errorf("step %d rank %d: copy %+v, want sum %s", st, r, cp, want)
				}
			}
		}
	}
}
