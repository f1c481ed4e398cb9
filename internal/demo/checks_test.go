package demo

import (
	"strings"
	"testing"
	"time"
)

func TestJudgeResume(t *testing.T) {
	// The killed run started at step 4 and reported steps 5 to 7 saved.
	digests := map[int64]string{4: "d4", 5: "d5", 6: "d6", 7: "d7"}
	ref := []string{"r0", "r1", "r2", "r3", "d4", "d5", "d6", "d7", "d8", "d9"}
	type testcase struct {
		got        Event
		stepOK     bool
		digestOK   bool
		pending    bool   // the digest can only be judged against ref
		detailWant string // a part of the step check's detail
	}
	tests := map[string]testcase{
		"last reported step, its digest":   {got: Event{Kind: KindResumed, Step: 7, Digest: "d7"}, stepOK: true, digestOK: true, detailWant: "the last step run 1 reported saved"},
		"last reported step, wrong digest": {got: Event{Kind: KindResumed, Step: 7, Digest: "d7x"}, stepOK: true},
		"an earlier step's digest":         {got: Event{Kind: KindResumed, Step: 7, Digest: "d6"}, stepOK: true},
		"committed, never reported": {got: Event{Kind: KindResumed, Step: 8, Digest: "d8"}, stepOK: true, digestOK: true, pending: true,
			detailWant: "after step 8 was committed but before run 1 reported it"},
		"committed, never reported, wrong digest": {got: Event{Kind: KindResumed, Step: 8, Digest: "d7"}, stepOK: true, pending: true},
		"an older checkpoint":                     {got: Event{Kind: KindResumed, Step: 6, Digest: "d6"}, detailWant: "only 7 or 8 is right"},
		"a step never saved":                      {got: Event{Kind: KindResumed, Step: 9, Digest: "d9"}},
		"checkpoint lost, fresh start":            {got: Event{Kind: KindFresh, Step: 0, Digest: "r0"}, detailWant: "lost"},
	}
	run := func(t *testing.T, tc testcase) {
		killed := &report{run: "run 1", digests: digests, last: 7}
		step, digest := judgeResume("a kill", killed, tc.got)
		if step.OK != tc.stepOK {
			t.Errorf("step check OK=%v, want %v: %s", step.OK, tc.stepOK, step.Detail)
		}
		if !strings.Contains(step.Detail, tc.detailWant) {
			t.Errorf("step detail %q lacks %q", step.Detail, tc.detailWant)
		}
		if digest.pending() != tc.pending {
			t.Fatalf("digest check pending=%v, want %v", digest.pending(), tc.pending)
		}
		resolveRef(&digest, ref)
		if digest.pending() {
			t.Fatal("resolveRef left the check pending")
		}
		if digest.OK != tc.digestOK {
			t.Errorf("digest check OK=%v, want %v: %s", digest.OK, tc.digestOK, digest.Detail)
		}
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

func TestJudgeAll(t *testing.T) {
	ref := []string{"r0", "r1", "r2", "r3"}
	good := []Event{{Kind: KindFresh, Step: 0, Digest: "r0"}, {Kind: KindSaved, Step: 1, Digest: "r1"},
		{Kind: KindSaveFailed, Step: 2}, {Kind: KindResumed, Step: 1, Digest: "r1"}, {Kind: KindDone, Step: 3, Digest: "r3"}}
	if c := judgeAll(good, ref); !c.OK || !strings.Contains(c.Detail, "all 4") {
		t.Errorf("judgeAll(good) = %+v", c)
	}
	for name, e := range map[string]Event{
		"wrong digest":      {Kind: KindSaved, Step: 2, Digest: "r1", Line: "bad"},
		"beyond the run":    {Kind: KindSaved, Step: 4, Digest: "r4", Line: "bad"},
		"negative step":     {Kind: KindSaved, Step: -1, Digest: "r0", Line: "bad"},
		"digest of another": {Kind: KindDone, Step: 3, Digest: "r2", Line: "bad"},
	} {
		if c := judgeAll(append(good[:len(good):len(good)], e), ref); c.OK || !strings.Contains(c.Detail, `"bad"`) {
			t.Errorf("%s: judgeAll = %+v, want a failure naming the line", name, c)
		}
	}
}

func TestTimings(t *testing.T) {
	var tm timings
	for _, e := range []Event{
		{Kind: KindFresh},
		{Kind: KindSaved, Bytes: 4 << 20, Save: 30 * time.Millisecond, Cold: true},
		{Kind: KindSaved, Bytes: 4 << 20, Save: 20 * time.Millisecond, Cold: true},
		{Kind: KindSaved, Bytes: 4 << 20, Save: 2 * time.Millisecond},
		{Kind: KindResumed, Restore: 5 * time.Millisecond},
		{Kind: KindSaved, Bytes: 4 << 20, Save: 3 * time.Millisecond},
	} {
		tm.add(e)
	}
	if tm.firstCold != 30*time.Millisecond || len(tm.cold) != 1 || len(tm.warm) != 2 || len(tm.restores) != 1 || tm.size != 4<<20 {
		t.Errorf("timings %+v", tm)
	}
}
