package agent

import (
	"testing"

	"rewind.dev/rewind/api/coordpb"
)

// TestPinAnswersApplyInRequestOrder: answers carrying pins can arrive out
// of order (a save's Latest call beside the report stream). An answer to
// an earlier request must not replace one to a later request: here the
// latest consistent step fell back from 5 to 4 (a copy of 5 was found
// corrupt) between the two, and the stale 5 would leave step 4, the only
// restorable one, unprotected.
func TestPinAnswersApplyInRequestOrder(t *testing.T) {
	r := &reporter{pins: map[string]pin{}}
	report := r.ask() // a report is sent
	latest := r.ask() // then a save asks for the latest step
	r.setPins(latest, []*coordpb.Pin{{Job: "j", Step: 4}})
	r.setPins(report, []*coordpb.Pin{{Job: "j", Step: 5}, {Job: "k", Step: 7}})
	if got := r.pinned("j").consistent; got != 4 {
		t.Fatalf("pin of j is %d after an older answer arrived late, want 4", got)
	}
	if got := r.pinned("k").consistent; got != 7 {
		t.Fatalf("pin of k is %d, want 7: no later answer spoke of k", got)
	}
	r.setPins(r.ask(), []*coordpb.Pin{{Job: "j", Step: -1}})
	if got := r.pinned("j").consistent; got != -1 {
		t.Fatalf("pin of j is %d after a newer answer said -1", got)
	}
}
