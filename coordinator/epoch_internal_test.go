package coordinator

import (
	"errors"
	"testing"
	"time"
)

// TestEpochFence drives the index through three epochs and checks which
// committed copies it takes: a save of an epoch the job left is taken
// only for steps every later epoch kept, whatever the step numbers of the
// epochs in between; a step never takes two epochs' shards.
func TestEpochFence(t *testing.T) {
	s, ch, rec := oneRankJob(t)
	apply := func(step int64, epoch uint64) error { return s.Apply(rec(step, epoch), ch) }
	for step := int64(1); step <= 100; step++ {
		if err := apply(step, 1); err != nil {
			t.Fatal(err)
		}
	}
	j := s.Jobs["j"]
	// Epoch 2 resumes from step 100, epoch 3 goes back to step 50 (an
	// operator's restore), then trains to 120.
	j.Epoch, j.Epochs = 2, []EpochStart{{2, 100}}
	if err := apply(101, 2); err != nil {
		t.Fatal(err)
	}
	j.Epoch, j.Epochs = 3, append(j.Epochs, EpochStart{3, 50})
	delete(j.Steps, 101)
	for step := int64(51); step <= 120; step++ {
		delete(j.Steps, step) // the re-gang dropped them; epoch 3 saves them again
	}
	for step := int64(51); step <= 120; step++ {
		if err := apply(step, 3); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		step  int64
		epoch uint64
		ok    bool
	}{
		{50, 1, true},   // kept by epochs 2 and 3: a late copy is one of the timeline
		{51, 1, false},  // epoch 3 went back to 50: epoch 1's 51 was left behind
		{99, 1, false},  // even though epoch 2 kept up to 100
		{101, 2, false}, // epoch 2's own step, left by epoch 3
		{105, 3, true},  // the current epoch's
		{50, 3, true},   // a restore's copy of the step epoch 3 resumed from
		{121, 2, false}, // a fenced rank saving on
		{121, 0, true},  // a copy the coordinator ordered
		{122, 4, true},  // newer than this index knows: a lost store (adoptEpoch)
	} {
		err := apply(c.step, c.epoch)
		if c.ok != (err == nil) || err != nil && !errors.Is(err, ErrFenced) {
			t.Errorf("step %d of epoch %d: %v, want taken %v", c.step, c.epoch, err, c.ok)
		}
	}
	if st := j.Steps[105]; st.Epoch != 3 {
		t.Errorf("step 105 is of epoch %d, want 3", st.Epoch)
	}
	// A step one epoch saved takes no shard of another.
	j.Steps[130] = &Step{Job: "j", Step: 130, WorldSize: 1, State: Partial, Copies: map[uint32][]*Copy{}, Epoch: 4}
	if err := apply(130, 3); !errors.Is(err, ErrFenced) {
		t.Errorf("epoch 3's shard into epoch 4's step: %v, want ErrFenced", err)
	}
}

// TestLeftBehindStepTakesTheNewEpoch: a re-gang to epoch 2 resumed from
// step 5; epoch 1's step 6, whose copy sits on a node that was down when
// the re-gang deleted it, is still in the index. Epoch 2's ranks saving
// step 6 replace it, and the step holds only epoch 2's shards.
func TestLeftBehindStepTakesTheNewEpoch(t *testing.T) {
	s := NewState(time.Now)
	var ch Changes
	if _, err := s.RegisterJob("j", 2, map[uint32]string{0: "a", 1: "b"}, &ch); err != nil {
		t.Fatal(err)
	}
	apply := func(step int64, rank uint32, node string, epoch uint64) error {
		return s.Apply(Record{Job: "j", Step: step, Rank: rank, WorldSize: 2, Node: node, Sum: "s", State: CopyCommitted, Epoch: epoch}, &ch)
	}
	for step := int64(1); step <= 5; step++ {
		for r, n := range []string{"a", "b"} {
			if err := apply(step, uint32(r), n, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := apply(6, 1, "b", 1); err != nil { // node b's rank saved 6, then b died
		t.Fatal(err)
	}
	j := s.Jobs["j"]
	j.Epoch, j.Epochs = 2, []EpochStart{{2, 5}}
	if err := apply(6, 0, "a", 1); !errors.Is(err, ErrFenced) {
		t.Fatalf("epoch 1's rank 0 saving step 6 after the re-gang: %v, want ErrFenced", err)
	}
	for r, n := range []string{"a", "c"} {
		if err := apply(6, uint32(r), n, 2); err != nil {
			t.Fatalf("epoch 2's rank %d saving step 6: %v", r, err)
		}
	}
	st := j.Steps[6]
	if st == nil || st.Epoch != 2 || st.State != Consistent || len(st.Copies[1]) != 1 || st.Copies[1][0].Node != "c" {
		t.Fatalf("step 6 after epoch 2 saved it: %+v", st)
	}
}

// TestLatestAnswerLeavesALeftStep: epoch 2 resumed from step 33 while the
// job's latest was epoch 1's step 34 (the re-gang has not deleted it
// yet): the answer is 33, not 34, so that it does not go back once the
// re-gang deletes 34 (found by the chaos suite's coordinator-regang: a
// coordinator that died between raising the epoch and the re-gang). Once
// epoch 2 saves its own 34, that is the answer.
func TestLatestAnswerLeavesALeftStep(t *testing.T) {
	s, ch, rec := oneRankJob(t)
	for step := int64(1); step <= 34; step++ {
		if err := s.Apply(rec(step, 1), ch); err != nil {
			t.Fatal(err)
		}
	}
	j := s.Jobs["j"]
	if got := j.latestAnswer(); got != 34 {
		t.Fatalf("before the re-gang the answer is %d, want 34", got)
	}
	j.Epoch, j.Epochs = 2, []EpochStart{{2, 33}}
	if got := j.latestAnswer(); got != 33 {
		t.Fatalf("with epoch 2 resuming from 33 the answer is %d, want 33 (34 is left behind)", got)
	}
	delete(j.Steps, 34) // the re-gang drops it; epoch 2 saves its own
	if err := s.Apply(rec(34, 2), ch); err != nil {
		t.Fatal(err)
	}
	if got := j.latestAnswer(); got != 34 {
		t.Fatalf("after epoch 2 saved 34 the answer is %d, want 34", got)
	}
}

// oneRankJob is an index holding job "j", one rank on node "a", with the
// changes it records and a committed copy of a step by a rank of an
// epoch.
func oneRankJob(t *testing.T) (*State, *Changes, func(step int64, epoch uint64) Record) {
	t.Helper()
	s := NewState(time.Now)
	ch := &Changes{}
	if _, err := s.RegisterJob("j", 1, map[uint32]string{0: "a"}, ch); err != nil {
		t.Fatal(err)
	}
	return s, ch, func(step int64, epoch uint64) Record {
		return Record{Job: "j", Step: step, Rank: 0, WorldSize: 1, Node: "a", Sum: "s", State: CopyCommitted, Epoch: epoch}
	}
}
