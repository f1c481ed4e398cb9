package agent_test

import (
	"strings"
	"testing"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/internal/testcluster"
)

// TestUnsafeNodeNameRefused: --node ../evil (or any name that is not one
// safe path element and DNS-like) stops the agent before it starts, with
// the rule.
func TestUnsafeNodeNameRefused(t *testing.T) {
	for _, node := range []string{"../evil", "a/b", ""} {
		cfg := testcluster.AgentConfig(t)
		cfg.Node = node
		_, err := agent.New(cfg)
		if err == nil || !strings.Contains(err.Error(), "starting and ending with a letter or digit") {
			t.Errorf("agent.New with node %q = %v; want a refusal that says the rule", node, err)
		}
	}
}
