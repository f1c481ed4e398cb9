package coordinator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	fakeclock "rewind.dev/rewind/internal/clock"
)

// TestPlanFallback runs the restore planner through the scenarios in
// testdata/plan/*: which step a restore chooses once copies are found
// corrupt and steps unrestorable, and what it says it passed over. The
// state commands are TestStateMachine's, and:
//
//	mark job=J step=S rank=R copies=TIER:NODE[!],...   (a restore found every copy of rank R failing; "!" corrupt)
//	clear job=J step=S
//	down node=X
//	plan job=J [step=S]
func TestPlanFallback(t *testing.T) {
	datadriven.Walk(t, "testdata/plan", func(t *testing.T, path string) {
		clock := time.Unix(1_800_000_000, 0)
		s := NewState(func() time.Time { clock = clock.Add(time.Millisecond); return clock })
		c := &Coordinator{state: s, down: map[string]time.Time{}, cfg: Config{Clock: fakeclock.NewFake(time.Unix(1_800_000_000, 0))}}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			job := arg(d, "job", "j")
			var ch Changes
			switch d.Cmd {
			case "mark":
				u := &Unrestorable{At: clock, Ranks: []RankFailure{{Rank: uint32(num(t, d, "rank", "0"))}}}
				for _, cp := range strings.Split(arg(d, "copies", ""), ",") {
					where, corrupt := strings.CutSuffix(cp, "!")
					u.Ranks[0].Copies = append(u.Ranks[0].Copies, CopyFailure{Copy: where, Error: "e", Corrupt: corrupt})
				}
				if err := s.MarkUnrestorable(job, num(t, d, "step", "0"), u, &ch); err != nil {
					return "error: " + err.Error() + "\n"
				}
				return showJob(s.Jobs[job]) + "\n"
			case "clear":
				if err := s.MarkUnrestorable(job, num(t, d, "step", "0"), nil, &ch); err != nil {
					return "error: " + err.Error() + "\n"
				}
				return showJob(s.Jobs[job]) + "\n"
			case "down":
				c.down[arg(d, "node", "")] = clock
				return "ok\n"
			case "plan":
				plan, err := c.plan(context.Background(), job, num(t, d, "step", "-1"), nil)
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				return showPlan(plan)
			}
			return runStateCmd(t, s, d)
		})
	})
}

func showPlan(p *coordpb.PlanRestoreResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "step %d\n", p.Step)
	for _, u := range p.Skipped {
		fmt.Fprintf(&b, "skipped %s\n", skippedText([]*coordpb.UnrestorableStep{u}))
	}
	for _, rp := range p.Ranks {
		var srcs []string
		for _, s := range rp.Sources {
			srcs = append(srcs, s.Tier+":"+s.Node)
		}
		fmt.Fprintf(&b, "rank %d: %s\n", rp.Rank, strings.Join(srcs, " "))
	}
	return b.String()
}

// TestUnrestorableFrom: a failed staging makes its step unrestorable only
// when every failing rank's agent answered and no source failed for want
// of room on the rank's node.
func TestUnrestorableFrom(t *testing.T) {
	corrupt := &agentpb.FetchAttempt{Tier: "pfs:-", Error: "checksum", Failure: agentpb.FetchFailure_FETCH_FAILURE_CORRUPT}
	gone := &agentpb.FetchAttempt{Tier: "shm:n2", Error: "unreachable", Failure: agentpb.FetchFailure_FETCH_FAILURE_UNAVAILABLE}
	full := &agentpb.FetchAttempt{Tier: "nvme:n0", Error: "budget", Failure: agentpb.FetchFailure_FETCH_FAILURE_NO_ROOM}
	plan := func(errs ...string) *coordpb.PlanRestoreResponse {
		p := &coordpb.PlanRestoreResponse{Job: "j", Step: 5}
		for r, e := range errs {
			p.Ranks = append(p.Ranks, &coordpb.RankPlan{Rank: uint32(r), Error: e})
		}
		return p
	}
	for name, tc := range map[string]struct {
		plan     *coordpb.PlanRestoreResponse
		attempts map[uint32][]*agentpb.FetchAttempt
		want     string // "" for nil
	}{
		"every copy of a rank corrupt or gone": {plan("failed", ""), map[uint32][]*agentpb.FetchAttempt{0: {gone, corrupt}, 1: nil},
			"rank 0: shm:n2 failed (unreachable); pfs:- corrupt (checksum)"},
		"two ranks": {plan("failed", "failed"), map[uint32][]*agentpb.FetchAttempt{0: {corrupt}, 1: {gone}},
			"rank 0: pfs:- corrupt (checksum); rank 1: shm:n2 failed (unreachable)"},
		"no room on the rank's node":  {plan("failed", ""), map[uint32][]*agentpb.FetchAttempt{0: {corrupt, full}}, ""},
		"the rank's agent unanswered": {plan("failed", "failed"), map[uint32][]*agentpb.FetchAttempt{0: {corrupt}}, ""},
		"nothing failed":              {plan("", ""), map[uint32][]*agentpb.FetchAttempt{0: nil, 1: nil}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			u := unrestorableFrom(tc.plan, tc.attempts, time.Unix(1, 0))
			switch {
			case tc.want == "" && u != nil:
				t.Fatalf("unrestorable: %s, want none", u)
			case tc.want != "" && (u == nil || u.String() != tc.want):
				t.Fatalf("unrestorable: %v, want %s", u, tc.want)
			}
		})
	}
}
