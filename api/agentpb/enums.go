package agentpb

import (
	"fmt"
	"strings"
)

// Label returns the state as people read it, the value's name without
// its type's prefix, in lower case: SHARD_STATE_COMMITTED is "committed".
func (s ShardState) Label() string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SHARD_STATE_"))
}

// MarshalText writes the state's label: encoding/json shows it so (the
// CLI's --json output); the wire and protojson are unchanged.
func (s ShardState) MarshalText() ([]byte, error) { return []byte(s.Label()), nil }

// UnmarshalText reads a state's label.
func (s *ShardState) UnmarshalText(b []byte) error {
	n, ok := ShardState_value["SHARD_STATE_"+strings.ToUpper(string(b))]
	if !ok {
		return fmt.Errorf("agentpb: unknown shard state label %q", b)
	}
	*s = ShardState(n)
	return nil
}

// Label returns the failure as people read it: FETCH_FAILURE_CORRUPT is
// "corrupt".
func (f FetchFailure) Label() string {
	return strings.ToLower(strings.TrimPrefix(f.String(), "FETCH_FAILURE_"))
}

// MarshalText writes the failure's label.
func (f FetchFailure) MarshalText() ([]byte, error) { return []byte(f.Label()), nil }
