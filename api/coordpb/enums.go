package coordpb

import (
	"fmt"
	"strings"
)

// Labels: each enum's values as logs, metrics and the CLI show them, the
// value's name without its type's prefix, in lower case
// (ORDER_KIND_PUSH is "push"). encoding/json writes them so too (the
// CLI's --json output); the wire and protojson are unchanged.

// Label returns the kind as logs and metrics name it: "push".
func (k OrderKind) Label() string { return label(k.String(), "ORDER_KIND_") }

// Label returns the state as people read it: "committed".
func (s CopyState) Label() string { return label(s.String(), "COPY_STATE_") }

// Label returns the state as people read it: "consistent".
func (s StepState) Label() string { return label(s.String(), "STEP_STATE_") }

// Label returns the state as people read it: "durable".
func (s TierCopyState) Label() string { return label(s.String(), "TIER_COPY_STATE_") }

// Label returns the kind as people read it: "regang".
func (k JobEventKind) Label() string { return label(k.String(), "JOB_EVENT_KIND_") }

// Label returns the answer as logs name it: "busy".
func (a SuspectAnswer) Label() string { return label(a.String(), "SUSPECT_ANSWER_") }

// Label returns the view as people name it: "summary".
func (v StepView) Label() string { return label(v.String(), "STEP_VIEW_") }

// Label returns the view as people name it: "summary".
func (v JobView) Label() string { return label(v.String(), "JOB_VIEW_") }

// MarshalText writes the kind's label.
func (k OrderKind) MarshalText() ([]byte, error) { return []byte(k.Label()), nil }

// MarshalText writes the state's label.
func (s CopyState) MarshalText() ([]byte, error) { return []byte(s.Label()), nil }

// MarshalText writes the state's label.
func (s StepState) MarshalText() ([]byte, error) { return []byte(s.Label()), nil }

// MarshalText writes the state's label.
func (s TierCopyState) MarshalText() ([]byte, error) { return []byte(s.Label()), nil }

// MarshalText writes the kind's label.
func (k JobEventKind) MarshalText() ([]byte, error) { return []byte(k.Label()), nil }

// MarshalText writes the answer's label.
func (a SuspectAnswer) MarshalText() ([]byte, error) { return []byte(a.Label()), nil }

// MarshalText writes the view's label.
func (v StepView) MarshalText() ([]byte, error) { return []byte(v.Label()), nil }

// MarshalText writes the view's label.
func (v JobView) MarshalText() ([]byte, error) { return []byte(v.Label()), nil }

// UnmarshalText reads a kind's label.
func (k *OrderKind) UnmarshalText(b []byte) error {
	return unlabel(b, "ORDER_KIND_", OrderKind_value, (*int32)(k))
}

// UnmarshalText reads a state's label.
func (s *CopyState) UnmarshalText(b []byte) error {
	return unlabel(b, "COPY_STATE_", CopyState_value, (*int32)(s))
}

// UnmarshalText reads a state's label.
func (s *StepState) UnmarshalText(b []byte) error {
	return unlabel(b, "STEP_STATE_", StepState_value, (*int32)(s))
}

// UnmarshalText reads a state's label.
func (s *TierCopyState) UnmarshalText(b []byte) error {
	return unlabel(b, "TIER_COPY_STATE_", TierCopyState_value, (*int32)(s))
}

// UnmarshalText reads a kind's label.
func (k *JobEventKind) UnmarshalText(b []byte) error {
	return unlabel(b, "JOB_EVENT_KIND_", JobEventKind_value, (*int32)(k))
}

// UnmarshalText reads a view's label.
func (v *StepView) UnmarshalText(b []byte) error {
	return unlabel(b, "STEP_VIEW_", StepView_value, (*int32)(v))
}

// UnmarshalText reads a view's label.
func (v *JobView) UnmarshalText(b []byte) error {
	return unlabel(b, "JOB_VIEW_", JobView_value, (*int32)(v))
}

// UnmarshalText reads an answer's label.
func (a *SuspectAnswer) UnmarshalText(b []byte) error {
	return unlabel(b, "SUSPECT_ANSWER_", SuspectAnswer_value, (*int32)(a))
}

func label(name, prefix string) string { return strings.ToLower(strings.TrimPrefix(name, prefix)) }

func unlabel(b []byte, prefix string, values map[string]int32, v *int32) error {
	n, ok := values[prefix+strings.ToUpper(string(b))]
	if !ok {
		return fmt.Errorf("coordpb: unknown %s label %q", strings.ToLower(strings.TrimSuffix(prefix, "_")), b)
	}
	*v = n
	return nil
}

// Kind returns what o orders; ORDER_KIND_UNSPECIFIED for an order that
// carries none (a newer coordinator's kind this agent does not know).
func (o *TransferOrder) Kind() OrderKind {
	switch o.GetOrder().(type) {
	case *TransferOrder_Push:
		return OrderKind_ORDER_KIND_PUSH
	case *TransferOrder_Manifest:
		return OrderKind_ORDER_KIND_MANIFEST
	case *TransferOrder_Delete:
		return OrderKind_ORDER_KIND_DELETE
	case *TransferOrder_Replicate:
		return OrderKind_ORDER_KIND_REPLICATE
	case *TransferOrder_Abort:
		return OrderKind_ORDER_KIND_ABORT
	case *TransferOrder_Resume:
		return OrderKind_ORDER_KIND_RESUME
	}
	return OrderKind_ORDER_KIND_UNSPECIFIED
}

// TierName returns the durable tier a push, manifest or delete order is
// for; "" for the other orders.
func (o *TransferOrder) TierName() string {
	switch x := o.GetOrder().(type) {
	case *TransferOrder_Push:
		return x.Push.GetTier()
	case *TransferOrder_Manifest:
		return x.Manifest.GetTier()
	case *TransferOrder_Delete:
		return x.Delete.GetTier()
	}
	return ""
}

// RankOf returns the rank a push or replicate order is for; 0 for the
// other orders.
func (o *TransferOrder) RankOf() uint32 {
	switch x := o.GetOrder().(type) {
	case *TransferOrder_Push:
		return x.Push.GetRank()
	case *TransferOrder_Replicate:
		return x.Replicate.GetRank()
	}
	return 0
}
