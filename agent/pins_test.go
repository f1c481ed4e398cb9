package agent

import (
	"io"
	"log/slog"
	"testing"
)

// rankWith returns a rank whose slots hold committed steps, oldest first;
// the last is the rank's latest checkpoint.
func rankWith(steps ...int64) *lockedRank {
	r := &lockedRank{}
	r.job = "j"
	for i, st := range steps {
		r.slots = append(r.slots, &slot{Index: uint32(i), State: stateCommitted, Step: st, Seq: uint64(i + 1), Size: 4096})
	}
	return r
}

// TestProtectedStepKeptBesideConsistent: a node lost while the latest
// consistent step's replicas are made leaves only the protected step (an
// older one, replicated) to restore every rank from. A save must not take
// its slot while another segment fits: here the rank holds the protected
// step 18, the consistent step 19 and its latest 20 in its three slots,
// and its save of 21 gets a fourth.
func TestProtectedStepKeptBesideConsistent(t *testing.T) {
	a := &Agent{budget: 1 << 20, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	pins := pinSet{consistent: 19, protected: 18}

	r := rankWith(18, 19, 20)
	s := a.pickPinned(r, 4096, 3, pins, false)
	if s == nil || s.State != stateFree || len(r.slots) != 4 {
		t.Fatalf("save of step 21 got %+v (%d slots), want a new fourth slot", s, len(r.slots))
	}

	// With the default two slots, the same: the latest (20) is a step
	// ahead of both pins, and the save of 21 is a fourth segment. Before,
	// the protected step gave way, and a node lost then left no step to
	// restore every rank from (found by the two-kill demo test).
	r = rankWith(18, 19, 20)
	if s := a.pickPinned(r, 4096, 2, pins, false); s == nil || s.State != stateFree || len(r.slots) != 4 {
		t.Fatalf("with two slots, the save of step 21 got %+v (%d slots), want a new fourth slot", s, len(r.slots))
	}

	// Ranks running ahead (a peer's node died; the job's consistent step
	// stays at 19): 20, 21 and 22 may each be consistent already, and
	// the save of 23 is a sixth segment, up to four more than the slots.
	r = rankWith(18, 19, 20, 21, 22)
	if s := a.pickPinned(r, 4096, 2, pinSet{consistent: 19, protected: 18, newer: true}, false); s == nil || s.State != stateFree || len(r.slots) != 6 {
		t.Fatalf("three steps ahead, the save of step 23 got %+v (%d slots), want a new sixth slot", s, len(r.slots))
	}

	// Once step 19 is protected too, the rotation is the usual one.
	r = rankWith(18, 19, 20)
	if s := a.pickPinned(r, 4096, 3, pinSet{consistent: 19, protected: 19}, false); s == nil || s.Step != 18 {
		t.Fatalf("with 19 protected, the save got %+v, want the slot of step 18", s)
	}

	// No budget for another segment: the protected step gives way rather
	// than the save failing; the consistent step and the latest stay.
	a.used = a.budget
	r = rankWith(18, 19, 20)
	if s := a.pickPinned(r, 4096, 3, pins, false); s == nil || s.Step != 18 || len(r.slots) != 3 {
		t.Fatalf("without budget, the save got %+v (%d slots), want the slot of step 18", s, len(r.slots))
	}

	// A replica's slots (one more than a rank's own) keep both pins as
	// well, and the oldest other step rotates.
	a.used = 0
	r = rankWith(16, 17, 18, 19, 20)
	if s := a.pickPinned(r, 4096, 4, pins, true); s == nil || s.Step != 16 {
		t.Fatalf("a replica got %+v, want the slot of step 16", s)
	}
}

func TestPinSet(t *testing.T) {
	for _, tc := range []struct {
		p     pinSet
		step  int64
		holds bool
		split bool
	}{
		{noPins, -1, false, false},
		{pinSet{5, 5, true}, 5, true, false},
		{pinSet{5, 4, true}, 4, true, true},
		{pinSet{5, 4, true}, 3, false, true},
		{pinSet{5, -1, true}, 5, true, false},
	} {
		if got := tc.p.holds(tc.step); got != tc.holds {
			t.Errorf("%+v.holds(%d) = %v, want %v", tc.p, tc.step, got, tc.holds)
		}
		if got := tc.p.split(); got != tc.split {
			t.Errorf("%+v.split() = %v, want %v", tc.p, got, tc.split)
		}
	}
}

// TestPinHoldsOneCopyOfItsStep: a rank restarted in place before step 11
// became consistent resumes step 10 and saves 11 again, so two slots hold
// step 11. Once 11 is the consistent (and protected) step, the pin holds
// the newer copy only: the next save takes the older one. Before, the pin
// held both, and every later save failed "slot not available" (found by
// the JobSet end-to-end test, whose pods restart ranks in place).
func TestPinHoldsOneCopyOfItsStep(t *testing.T) {
	r := rankWith(11, 11)
	got := r.pick(4096, 2, pinSet{consistent: 11, protected: 11}, false)
	if got == nil || got.Seq != 1 {
		t.Fatalf("pick = %+v, want the older copy of step 11 (seq 1)", got)
	}
	// A single copy of a pinned step stays held.
	r = rankWith(10, 11)
	if got := r.pick(4096, 2, pinSet{consistent: 10, protected: 10}, false); got != nil {
		t.Fatalf("pick = %+v, want none: step 10 is pinned and 11 the latest", got)
	}
}

// TestAnOlderNewestSlotIsNotHeld: the newest slot by commit order can
// hold an older step than the job's consistent one: a replica of step 2
// made after the rank saved step 3 (a node lost, its copies made again
// elsewhere). It is no checkpoint a restore would take, and the save of
// step 4 takes it; before, it was held as the rank's latest and the save
// failed "slot not available" (found by TestElasticRecoveryShrinks under
// load).
func TestAnOlderNewestSlotIsNotHeld(t *testing.T) {
	r := rankWith(3, 2) // step 2 committed last
	if got := r.pick(4096, 2, pinSet{consistent: 3, protected: 3}, false); got == nil || got.Step != 2 {
		t.Fatalf("pick = %+v, want the slot of step 2, older than the consistent step 3", got)
	}
	// Still held while it is the newest step there is: no coordinator,
	// or the consistent step not newer.
	if got := rankWith(3, 2).pick(4096, 2, noPins, false); got == nil || got.Step != 3 {
		t.Fatalf("without a coordinator pick = %+v, want the slot of step 3 (2 is the latest)", got)
	}
	if got := rankWith(1, 2).pick(4096, 2, pinSet{consistent: 1, protected: 1}, false); got != nil {
		t.Fatalf("pick = %+v, want none: 1 pinned, 2 the latest", got)
	}
}

// TestNewerThanConsistentKept: a rank holds steps 10 (the consistent step
// it was told), 11 and 12 (its latest) in three slots. Step 11 may be
// consistent already, answered so to someone, while this agent's answer
// saying so is still to come (or lost with a coordinator that died): the
// save of 13 must not take its slot. Once told 11 is consistent, the slot
// of 10 goes. Without a coordinator (noPins) a rank rotates as before,
// and a replica's slots are not held back.
func TestNewerThanConsistentKept(t *testing.T) {
	told := pinSet{consistent: 10, protected: 10, newer: true}
	if got := rankWith(10, 11, 12).pick(4096, 3, told, false); got != nil {
		t.Fatalf("pick = %+v, want none: 10 pinned, 11 newer than it, 12 the latest", got)
	}
	if got := rankWith(10, 11, 12).pick(4096, 3, pinSet{consistent: 11, protected: 11, newer: true}, false); got == nil || got.Step != 10 {
		t.Fatalf("pick = %+v, want the slot of step 10 once 11 is consistent", got)
	}
	if got := rankWith(9, 10, 11, 12).pick(4096, 4, told, false); got == nil || got.Step != 9 {
		t.Fatalf("pick = %+v, want the slot of step 9, older than the consistent step", got)
	}
	if got := rankWith(10, 11, 12).pick(4096, 3, noPins, false); got == nil || got.Step != 10 {
		t.Fatalf("without a coordinator pick = %+v, want the slot of step 10", got)
	}
	if got := rankWith(10, 11, 12).pick(4096, 3, told, true); got == nil || got.Step != 11 {
		t.Fatalf("a replica's pick = %+v, want the slot of step 11", got)
	}
}
