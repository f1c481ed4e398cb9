package shm

import (
	"strings"
	"testing"
)

// TestValidateNode: host names and Kubernetes node names pass; anything
// that is not one safe path element, or not a DNS-like name, is refused
// with the rule.
func TestValidateNode(t *testing.T) {
	for _, ok := range []string{"vm", "node-3", "ip-10-0-0-7.ec2.internal", "gke-pool-1-abc_x", "N1", strings.Repeat("a", MaxNodeLen)} {
		if err := ValidateNode(ok); err != nil {
			t.Errorf("ValidateNode(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "../evil", "..", ".", "a/b", "/abs", "-lead", "trail.", "sp ace", "tab\t", "nul\x00", "ünï", "a:1", strings.Repeat("a", MaxNodeLen+1)} {
		err := ValidateNode(bad)
		if err == nil || !strings.Contains(err.Error(), "1 to 253 letters, digits") {
			t.Errorf("ValidateNode(%q) = %v; want a refusal that says the rule", bad, err)
		}
	}
}
