package coordpb

import (
	"encoding"
	"encoding/json"
	"testing"
)

// TestLabels: every value of every enum goes to its label and back, and
// encoding/json writes the label.
func TestLabels(t *testing.T) {
	type enum interface {
		Label() string
		encoding.TextMarshaler
	}
	check := func(v enum, back encoding.TextUnmarshaler, same func() bool) {
		t.Helper()
		b, err := v.MarshalText()
		if err != nil || string(b) != v.Label() {
			t.Fatalf("%v: MarshalText %q, %v; want %q", v, b, err, v.Label())
		}
		if err := back.UnmarshalText(b); err != nil || !same() {
			t.Fatalf("%v: label %q does not read back: %v", v, b, err)
		}
	}
	for n := range OrderKind_name {
		var got OrderKind
		check(OrderKind(n), &got, func() bool { return got == OrderKind(n) })
	}
	for n := range CopyState_name {
		var got CopyState
		check(CopyState(n), &got, func() bool { return got == CopyState(n) })
	}
	for n := range StepState_name {
		var got StepState
		check(StepState(n), &got, func() bool { return got == StepState(n) })
	}
	for n := range StepView_name {
		var got StepView
		check(StepView(n), &got, func() bool { return got == StepView(n) })
	}
	for n := range JobView_name {
		var got JobView
		check(JobView(n), &got, func() bool { return got == JobView(n) })
	}
	for n := range TierCopyState_name {
		var got TierCopyState
		check(TierCopyState(n), &got, func() bool { return got == TierCopyState(n) })
	}
	for n := range JobEventKind_name {
		var got JobEventKind
		check(JobEventKind(n), &got, func() bool { return got == JobEventKind(n) })
	}
	for n := range SuspectAnswer_name {
		var got SuspectAnswer
		check(SuspectAnswer(n), &got, func() bool { return got == SuspectAnswer(n) })
	}
	if l := OrderKind_ORDER_KIND_PUSH.Label(); l != "push" {
		t.Fatalf("push's label is %q", l)
	}
	var s StepState
	if err := s.UnmarshalText([]byte("sideways")); err == nil {
		t.Fatal("an unknown label was read")
	}
	b, err := json.Marshal(&Step{Step: 3, State: StepState_STEP_STATE_CONSISTENT})
	if err != nil || string(b) != `{"step":3,"state":"consistent"}` {
		t.Fatalf("json: %s, %v", b, err)
	}
}

// TestOrderKind: an order's kind, tier and rank come from its oneof.
func TestOrderKind(t *testing.T) {
	for name, tc := range map[string]struct {
		o    *TransferOrder
		kind OrderKind
		tier string
		rank uint32
	}{
		"push":      {&TransferOrder{Order: &TransferOrder_Push{Push: &PushOrder{Tier: "s3", Rank: 3}}}, OrderKind_ORDER_KIND_PUSH, "s3", 3},
		"manifest":  {&TransferOrder{Order: &TransferOrder_Manifest{Manifest: &ManifestOrder{Tier: "pfs"}}}, OrderKind_ORDER_KIND_MANIFEST, "pfs", 0},
		"delete":    {&TransferOrder{Order: &TransferOrder_Delete{Delete: &DeleteOrder{Tier: "nvme"}}}, OrderKind_ORDER_KIND_DELETE, "nvme", 0},
		"replicate": {&TransferOrder{Order: &TransferOrder_Replicate{Replicate: &ReplicateOrder{Rank: 2}}}, OrderKind_ORDER_KIND_REPLICATE, "", 2},
		"abort":     {&TransferOrder{Order: &TransferOrder_Abort{Abort: &AbortOrder{}}}, OrderKind_ORDER_KIND_ABORT, "", 0},
		"resume":    {&TransferOrder{Order: &TransferOrder_Resume{Resume: &ResumeOrder{}}}, OrderKind_ORDER_KIND_RESUME, "", 0},
		"none":      {&TransferOrder{}, OrderKind_ORDER_KIND_UNSPECIFIED, "", 0},
	} {
		if k, tier, r := tc.o.Kind(), tc.o.TierName(), tc.o.RankOf(); k != tc.kind || tier != tc.tier || r != tc.rank {
			t.Errorf("%s: kind %v tier %q rank %d, want %v %q %d", name, k, tier, r, tc.kind, tc.tier, tc.rank)
		}
	}
}
