package sdk_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// TestJobBudgetKeepsJobsApart: with --job-budget 12 MiB on a node of 64
// MiB, job a's ranks fill their share (two 4 MiB segments of rank 0)
// and rank 1's first save is refused with ErrResourceExhausted naming the
// job's share, while job b saves as much beside it; a's saved step stays
// restorable. An agent restarted over the same memory counts a's
// segments against its share again.
func TestJobBudgetKeepsJobsApart(t *testing.T) {
	const mib = 1 << 20
	mod := func(cfg *agent.Config) { cfg.BudgetBytes, cfg.JobBudgetBytes = 64*mib, 12*mib }
	c, ag := start(t, mod)
	state := func(seed uint64) []sdk.Tensor {
		return []sdk.Tensor{{Name: "w", DType: shm.U8, Shape: []int64{4 * mib}, Data: pattern(seed, 4*mib)}}
	}
	a0 := session(t, c, "a", 0, 2)
	for step := int64(1); step <= 3; step++ { // two slots: the third save reuses the first's segment
		if err := a0.Save(ctxT(t), step, state(uint64(step)), nil); err != nil {
			t.Fatalf("job a rank 0 step %d: %v", step, err)
		}
	}
	refused := func(c *sdk.Client) {
		t.Helper()
		err := session(t, c, "a", 1, 2).Save(ctxT(t), 1, state(9), nil)
		if !errors.Is(err, sdk.ErrResourceExhausted) || !strings.Contains(err.Error(), "--job-budget") {
			t.Fatalf("job a rank 1 past the job's share: %v, want ErrResourceExhausted naming --job-budget", err)
		}
	}
	refused(c)
	b0 := session(t, c, "b", 0, 1)
	for step := int64(1); step <= 2; step++ {
		if err := b0.Save(ctxT(t), step, state(uint64(10+step)), nil); err != nil {
			t.Fatalf("job b beside a full job a: %v", err)
		}
	}
	cp, err := a0.Restore(ctxT(t))
	if err != nil || cp.Step != 3 || !bytes.Equal(cp.Tensors[0].Data, state(3)[0].Data) {
		t.Fatalf("job a's step 3 after the refusal: %v, %v", cp, err)
	}

	ag.Stop()
	c.Close()
	cfg := ag.Config
	testcluster.StartAgent(t, cfg)
	refused(testcluster.Dial(t, cfg.Socket))
}
