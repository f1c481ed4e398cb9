package demo

import (
	"errors"
	"os"
	"testing"
)

// TestDurableResumesFromAStepEveryRankWrote: a restart resumes from the
// newest step whose file every rank has, bit for bit, never from a step
// some rank had not written yet; each rank keeps its two newest files.
func TestDurableResumesFromAStepEveryRankWrote(t *testing.T) {
	cfg := TrainConfig{DurableDir: t.TempDir(), DurableEvery: 2, World: 2, Size: MinSize}
	if _, err := loadDurable(cfg); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("load with no files: %v, want os.ErrNotExist", err)
	}
	states := make([]*State, 2)
	digests := map[int64]string{}
	for r := range uint32(2) {
		st, err := NewRankState(cfg.Size, r)
		if err != nil {
			t.Fatal(err)
		}
		states[r] = st
	}
	for step := int64(1); step <= 6; step++ {
		for r, st := range states {
			st.Step()
			if step%2 != 0 || r == 1 && step == 6 { // rank 1 dies before writing step 6
				continue
			}
			c := cfg
			c.Rank = uint32(r)
			if err := writeDurable(c, st); err != nil {
				t.Fatal(err)
			}
			if r == 0 {
				digests[step] = st.Digest()
			}
		}
	}
	got, err := loadDurable(cfg) // rank 0
	if err != nil {
		t.Fatal(err)
	}
	if got.Obj.Step != 4 || got.Digest() != digests[4] {
		t.Fatalf("resumed at step %d digest %s, want step 4 digest %s", got.Obj.Step, got.Digest(), digests[4])
	}
	steps, err := durableSteps(cfg.DurableDir + "/rank-0")
	if err != nil || len(steps) != 2 || steps[0] != 6 || steps[1] != 4 {
		t.Fatalf("rank 0 keeps steps %v (%v), want [6 4]", steps, err)
	}
}
