package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/demo"
)

// fixture builds a scenario's evidence: ranks' report lines with the
// reference run's digests (a small state, so references are quick).
type fixture struct {
	t   *testing.T
	t0  time.Time
	ref *references
	ev  Evidence
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, t0: time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC), ref: newReferences(demo.MinSize)}
	f.ev = Evidence{WorldSize: 2, Size: demo.MinSize, Progress: 2, Keep: map[string]int{"nvme": 2, "s3": 2}}
	return f
}

func (f *fixture) at(sec float64) time.Time {
	return f.t0.Add(time.Duration(sec * float64(time.Second)))
}

func (f *fixture) digest(rank uint32, step int64) string {
	d, err := f.ref.digest(rank, step)
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

// line adds a rank's report line at sec seconds.
func (f *fixture) line(sec float64, svc string, rank uint32, text string) {
	l, ok := parseLine(svc, fmt.Sprintf("%s [rank %d] %s", f.at(sec).Format(time.RFC3339Nano), rank, text))
	if !ok {
		f.t.Fatalf("bad line %q", text)
	}
	f.ev.Lines = append(f.ev.Lines, l)
}

// train adds saves of steps from..to (inclusive) of rank, one a second
// from sec on.
func (f *fixture) train(sec float64, svc string, rank uint32, from, to int64) {
	for s := from; s <= to; s++ {
		f.line(sec+float64(s-from), svc, rank, fmt.Sprintf("step %d compute 1.0 ms saved 64.0 KiB in 1.0 ms digest %s", s, f.digest(rank, s)))
	}
}

func (f *fixture) resume(sec float64, svc string, rank uint32, step int64) {
	f.line(sec, svc, rank, fmt.Sprintf("resumed step %d digest %s restore 1.0 ms", step, f.digest(rank, step)))
}

// step is a consistent step with each rank's copy on the named nodes
// ("-" for the object store) and the tiers it is durable on.
func step(n int64, copies map[uint32][]string, durable ...string) *coordpb.Step {
	st := &coordpb.Step{Step: n, WorldSize: uint32(len(copies)), State: coordpb.StepState_STEP_STATE_CONSISTENT, RanksCommitted: uint32(len(copies))}
	for r, nodes := range copies {
		for _, node := range nodes {
			tier := "shm"
			if node == sharedNode {
				tier = "s3"
			}
			st.Copies = append(st.Copies, &coordpb.Copy{Rank: r, Node: node, Tier: tier})
		}
	}
	for _, t := range durable {
		st.Tiers = append(st.Tiers, &coordpb.TierCopy{Tier: t, State: coordpb.TierCopyState_TIER_COPY_STATE_DURABLE, RanksDone: st.WorldSize})
	}
	return st
}

// killFixture: ranks 0 (node1) and 1 (node2) train steps 1-5; node2 is
// killed at 5.5 s; the job recovers at step 5 with rank 1 on node3, and
// both ranks train to step 8.
func killFixture(t *testing.T) *fixture {
	f := newFixture(t)
	f.train(0, "node1", 0, 1, 5)
	f.train(0, "node2", 1, 1, 5)
	before := &Snapshot{At: f.at(5.4), Steps: []*coordpb.Step{
		step(4, map[uint32][]string{0: {"node1"}, 1: {"node2", "node3"}}, "s3"),
		step(5, map[uint32][]string{0: {"node1"}, 1: {"node2"}}), // rank 1's replica still in flight
	}}
	f.ev.Faults = []Fault{{What: "kill node2", At: f.at(5.5), Node: "node2", Lost: true, Before: before}}
	f.ev.Recoveries = []*coordpb.JobEvent{{Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Ok: true, Step: 4, DetectedUnixNano: f.at(6.5).UnixNano()}}
	f.resume(7, "node1", 0, 4)
	f.resume(7.1, "node3", 1, 4)
	f.train(8, "node1", 0, 5, 8)
	f.train(8, "node3", 1, 5, 8)
	f.ev.Snapshots = []*Snapshot{before}
	f.ev.Final = &Snapshot{At: f.at(20), Steps: []*coordpb.Step{
		step(4, map[uint32][]string{0: {"node1", "-"}, 1: {"node3", "-"}}, "s3"),
		step(8, map[uint32][]string{0: {"node1", "-"}, 1: {"node3", "-"}}, "s3"),
	}, Job: &coordpb.Job{Placement: map[uint32]string{0: "node1", 1: "node3"}}}
	return f
}

func TestCheckResumed(t *testing.T) {
	type testcase struct {
		change func(f *fixture)
		ok     bool
		detail string // a part of the detail
	}
	run := func(t *testing.T, tc testcase) {
		f := killFixture(t)
		tc.change(f)
		c := checkResumed(&f.ev)
		if c.OK != tc.ok || !strings.Contains(c.Detail, tc.detail) {
			t.Fatalf("checkResumed = %v %q, want %v with %q", c.OK, c.Detail, tc.ok, tc.detail)
		}
	}
	tests := map[string]testcase{
		"recovered and trained on": {change: func(*fixture) {}, ok: true, detail: "every rank trained 2 steps past step 4"},
		"a rank never resumed": {change: func(f *fixture) {
			f.ev.Lines = dropLines(f.ev.Lines, func(l Line) bool { return l.Rank == 1 && l.Event.Kind == demo.KindResumed })
		}, detail: "rank 1 never resumed step 4"},
		"a rank resumed another step": {change: func(f *fixture) {
			f.ev.Recoveries[0].Step = 3
		}, detail: "never resumed step 3"},
		"no recovery": {change: func(f *fixture) { f.ev.Recoveries = nil }, detail: "0 recoveries for 1 lost nodes"},
		"a failed recovery": {change: func(f *fixture) {
			f.ev.Failed = []*coordpb.JobEvent{{Kind: coordpb.JobEventKind_JOB_EVENT_KIND_FAILED, Error: "no copy of rank 1"}}
		}, detail: "recovery failed: no copy of rank 1"},
		"too little progress": {change: func(f *fixture) { f.ev.Progress = 5 }, detail: "want 9"},
		"a restart without a lost node": {change: func(f *fixture) {
			f.ev.Faults[0].Lost = false
			f.ev.Recoveries = nil
		}, detail: "restarted"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

func dropLines(lines []Line, drop func(Line) bool) []Line {
	var out []Line
	for _, l := range lines {
		if l.Event == nil || !drop(l) {
			out = append(out, l)
		}
	}
	return out
}

func TestCheckDigests(t *testing.T) {
	f := killFixture(t)
	c, restored := checkDigests(&f.ev, f.ref)
	if !c.OK || restored != 2*demo.MinSize {
		t.Fatalf("good digests: %v %q, %d restored bytes", c.OK, c.Detail, restored)
	}
	// A restore one bit off the reference: a different digest.
	f.line(9, "node3", 1, fmt.Sprintf("resumed step 4 digest %s restore 1.0 ms", f.digest(1, 5)))
	if c, _ := checkDigests(&f.ev, f.ref); c.OK || !strings.Contains(c.Detail, "rank 1 on node3") {
		t.Fatalf("a wrong restored digest passed: %q", c.Detail)
	}
	// A rank's digest checked against its own reference, not rank 0's.
	g := newFixture(t)
	g.line(1, "node1", 1, fmt.Sprintf("step 1 compute 1.0 ms saved 64.0 KiB in 1.0 ms digest %s", g.digest(0, 1)))
	if c, _ := checkDigests(&g.ev, g.ref); c.OK {
		t.Fatal("rank 1 reporting rank 0's state passed")
	}
	if c, _ := checkDigests(&newFixture(t).ev, f.ref); c.OK {
		t.Fatal("no digest at all passed")
	}
}

func TestCheckDurableKept(t *testing.T) {
	type testcase struct {
		final []*coordpb.Step
		lost  bool
		ok    bool
	}
	run := func(t *testing.T, tc testcase) {
		f := killFixture(t)
		f.ev.Faults[0].Lost = tc.lost
		f.ev.Snapshots[0].Steps = []*coordpb.Step{
			step(2, map[uint32][]string{0: {"node1"}, 1: {"node2"}}, "nvme"),
			step(4, map[uint32][]string{0: {"node1"}, 1: {"node2"}}, "s3", "nvme"),
		}
		f.ev.Final.Steps = tc.final
		if c := checkDurableKept(&f.ev); c.OK != tc.ok {
			t.Fatalf("checkDurableKept = %v %q, want %v", c.OK, c.Detail, tc.ok)
		}
	}
	two := map[uint32][]string{0: {"node1"}, 1: {"node3"}}
	tests := map[string]testcase{
		"kept": {final: []*coordpb.Step{step(2, two, "nvme"), step(4, two, "s3", "nvme")}, ok: true},
		"replaced by two newer under retention": {final: []*coordpb.Step{
			step(6, two, "s3", "nvme"), step(8, two, "s3", "nvme")}, ok: true},
		"replaced by only one newer": {final: []*coordpb.Step{step(2, two, "nvme"), step(8, two, "s3", "nvme")}},
		"lost from s3":               {final: []*coordpb.Step{step(2, two, "nvme"), step(4, two, "nvme")}},
		// A lost node's NVMe is gone with it: only s3 counts then.
		"nvme gone with a lost node": {final: []*coordpb.Step{step(4, two, "s3")}, lost: true, ok: true},
		"nvme gone, no node lost":    {final: []*coordpb.Step{step(4, two, "s3")}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

func TestCheckNewestRestorable(t *testing.T) {
	f := killFixture(t)
	// Step 5's rank 1 lived only on node2, now down: 4 is the newest.
	if got := f.ev.Faults[0].Before.NewestRestorable(map[string]bool{"node2": true}); got != 4 {
		t.Fatalf("newest restorable without node2: %d, want 4", got)
	}
	if got := f.ev.Faults[0].Before.NewestRestorable(nil); got != 5 {
		t.Fatalf("newest restorable with every node: %d, want 5", got)
	}
	if c := checkNewestRestorable(&f.ev); !c.OK {
		t.Fatalf("restore of the newest restorable step: %q", c.Detail)
	}
	f.ev.Recoveries[0].Step = 3
	if c := checkNewestRestorable(&f.ev); c.OK || !strings.Contains(c.Detail, "step 3") {
		t.Fatalf("a restore of an older step passed: %q", c.Detail)
	}
	// Passing over step 4 is excused by a copy that failed, not by a rank
	// whose copies were all gone by then (the product reused their slots).
	gone := &coordpb.UnrestorableStep{Step: 4, Ranks: []*coordpb.RankFailure{{Rank: 1, Copies: []*coordpb.CopyFailure{{Error: "no copy left (1 of 2 ranks have none)"}}}}}
	f.ev.Recoveries[0].Skipped = []*coordpb.UnrestorableStep{gone}
	if c := checkNewestRestorable(&f.ev); c.OK {
		t.Fatalf("a restore that passed over a step whose copies were reused passed: %q", c.Detail)
	}
	f.ev.Faults[0].Delayed = true // the view is of the arming: the ranks trained on since
	if c := checkNewestRestorable(&f.ev); !c.OK {
		t.Fatalf("a delayed fault's restore that passed over a step whose copies were reused since failed: %q", c.Detail)
	}
	f.ev.Faults[0].Delayed = false
	gone.Ranks[0].Copies = append(gone.Ranks[0].Copies, &coordpb.CopyFailure{Copy: "shm:node1", Error: "its checksum did not match", Corrupt: true})
	if c := checkNewestRestorable(&f.ev); !c.OK {
		t.Fatalf("a restore that passed over a step with a corrupt copy failed: %q", c.Detail)
	}
	f.ev.Recoveries = nil
	if c := checkNewestRestorable(&f.ev); c.OK {
		t.Fatal("a lost node without a recovery passed")
	}
}

func TestCheckTierCopiesWhole(t *testing.T) {
	f := killFixture(t)
	if c := checkTierCopiesWhole(&f.ev); !c.OK {
		t.Fatal(c.Detail)
	}
	f.ev.Final.Steps[1].Tiers[0].RanksDone = 1
	if c := checkTierCopiesWhole(&f.ev); c.OK || !strings.Contains(c.Detail, "1 of 2 ranks") {
		t.Fatalf("a durable copy missing a rank passed: %q", c.Detail)
	}
}

func TestCheckStaleQuiet(t *testing.T) {
	f := killFixture(t)
	f.ev.Faults[0].Healed = f.at(10)
	if c := checkStaleQuiet(&f.ev, "node2"); !c.OK {
		t.Fatal(c.Detail)
	}
	// node2 comes back and its old rank 1 saves a step of the old gang.
	f.line(11, "node2", 1, fmt.Sprintf("step 6 compute 1.0 ms saved 64.0 KiB in 1.0 ms digest %s", f.digest(1, 6)))
	if c := checkStaleQuiet(&f.ev, "node2"); c.OK || !strings.Contains(c.Detail, "placed on node3") {
		t.Fatalf("a save by the old gang passed: %q", c.Detail)
	}
}

func TestStepsLostAndResumedAfter(t *testing.T) {
	f := killFixture(t)
	if got := stepsLost(&f.ev); len(got) != 1 || got[0] != 1 {
		t.Fatalf("steps lost %v, want [1] (5 saved, 4 restored)", got)
	}
	if got := resumedAfter(&f.ev); len(got) != 1 || got[0] != 1600*time.Millisecond {
		t.Fatalf("resumed after %v, want [1.6s]", got)
	}
}

// The read-back of the newest durable step counts the copies found whole,
// leaves out those on nodes a fault hit and copies in memory gone since,
// and names the first copy on the tier that failed: the check fails on
// it unless retention retired the step meanwhile (verifyNewest).
func TestVerifiedCopies(t *testing.T) {
	cp := func(rank uint32, node, tier string) *coordpb.Copy {
		return &coordpb.Copy{Rank: rank, Node: node, Tier: tier, SizeBytes: 100}
	}
	resp := &coordpb.VerifyStepResponse{Checks: []*coordpb.CopyCheck{
		{Copy: cp(0, "node1", "s3"), Ok: true},
		{Copy: cp(1, "node3", "s3"), Problem: "unreadable"}, // on a node the fault hit
		{Copy: cp(1, "node2", "shm"), Problem: "slot reused"},
		{Copy: cp(2, "node2", "s3"), Ok: true},
	}}
	n, bytes, bad := verifiedCopies(resp, "s3", map[string]bool{"node3": true})
	if n != 2 || bytes != 200 || bad != "" {
		t.Fatalf("verifiedCopies = %d, %d, %q; want 2 copies, 200 bytes, none bad", n, bytes, bad)
	}
	resp.Checks = append(resp.Checks, &coordpb.CopyCheck{Copy: cp(3, "node1", "s3"), Problem: "not found"})
	if _, _, bad := verifiedCopies(resp, "s3", nil); !strings.Contains(bad, "rank 1 on s3: unreadable") {
		t.Fatalf("bad = %q, want the first copy on s3 that failed, named", bad)
	}
}

// jointFixture: node2 (rank 1) is killed at 5.5 s and, during the
// recovery, node3, which held rank 1's only other copy of step 4; the
// try under way fails, the next restores step 2 from the object store,
// rank 1 on node1, and both ranks train to step 5.
func jointFixture(t *testing.T) *fixture {
	f := newFixture(t)
	f.train(0, "node1", 0, 1, 5)
	f.train(0, "node2", 1, 1, 5)
	before := &Snapshot{At: f.at(5.4), Steps: []*coordpb.Step{
		step(2, map[uint32][]string{0: {"node1", "-"}, 1: {"node2", "-"}}, "s3"),
		step(4, map[uint32][]string{0: {"node1"}, 1: {"node2", "node3"}}),
	}}
	f.ev.Faults = []Fault{
		{What: "kill node2", At: f.at(5.5), Node: "node2", Lost: true, Before: before},
		{What: "kill node3, the source of rank 1's restore", At: f.at(6), Node: "node3", Lost: true, Before: before, Joint: true},
	}
	f.ev.Failed = []*coordpb.JobEvent{{Kind: coordpb.JobEventKind_JOB_EVENT_KIND_FAILED, Error: "rank 1: no source could restore it"}}
	f.ev.Recoveries = []*coordpb.JobEvent{{Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Ok: true, Step: 2, DetectedUnixNano: f.at(6.5).UnixNano()}}
	f.resume(9, "node1", 0, 2)
	f.resume(9.1, "node1", 1, 2)
	f.train(10, "node1", 0, 3, 5)
	f.train(10, "node1", 1, 3, 5)
	f.ev.Snapshots = []*Snapshot{before}
	f.ev.Final = &Snapshot{At: f.at(20), Steps: []*coordpb.Step{step(2, map[uint32][]string{0: {"node1", "-"}, 1: {"node1", "-"}}, "s3")}}
	return f
}

// TestJointLoss: a node lost during the recovery from another's loss
// calls for one recovery, restorable without both; tries that failed
// meanwhile pass only when a recovery came after them.
func TestJointLoss(t *testing.T) {
	f := jointFixture(t)
	if c := checkResumed(&f.ev); !c.OK {
		t.Fatalf("a recovery tried again after a joint loss: %q", c.Detail)
	}
	if c := checkNewestRestorable(&f.ev); !c.OK || !strings.Contains(c.Detail, "newest restorable before kill node2: 2") {
		t.Fatalf("the restore of the newest step restorable without both nodes: %v %q", c.OK, c.Detail)
	}
	f.ev.Recoveries[0].Step = 1
	if c := checkNewestRestorable(&f.ev); c.OK {
		t.Fatalf("a restore older than restorable without both nodes passed: %q", c.Detail)
	}
	f.ev.Recoveries[0].Step = 2

	f.ev.Recoveries = nil
	if c := checkResumed(&f.ev); c.OK || !strings.Contains(c.Detail, "recovery failed") {
		t.Fatalf("a joint loss never recovered from passed: %v %q", c.OK, c.Detail)
	}

	g := jointFixture(t)
	g.ev.Faults[1].Joint = false // two losses, each its own recovery: the failed try counts
	if c := checkResumed(&g.ev); c.OK || !strings.Contains(c.Detail, "recovery failed") || !strings.Contains(c.Detail, "1 recoveries for 2 lost nodes") {
		t.Fatalf("two separate losses with a failed recovery: %v %q", c.OK, c.Detail)
	}
}
