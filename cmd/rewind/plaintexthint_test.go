package main

import (
	"strings"
	"testing"

	"rewind.dev/rewind/internal/testcluster"
)

// TestPlaintextCommandNamesTLS: an operator command without a
// certificate directory, against a coordinator with TLS, fails naming
// --tls-dir and $REWIND_TLS_DIR; against a port where nothing listens it
// fails as gRPC says, with no word of TLS.
func TestPlaintextCommandNamesTLS(t *testing.T) {
	t.Setenv(EnvTLSDir, "")
	tlsCoord := testcluster.StartCoordinator(t, testcluster.CoordinatorConfig(t)).Addr
	for name, tc := range map[string]struct {
		addr         string
		want, refuse []string
	}{
		"a coordinator with TLS": {tlsCoord, []string{tlsCoord, "closed a plaintext connection", "--tls-dir", "$REWIND_TLS_DIR"}, nil},
		"nothing listening":      {testcluster.FreeAddr(t), []string{"connection refused"}, []string{"--tls-dir"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := capture(t, runLs, "--coordinator", tc.addr, "--timeout", "20s")
			if err == nil {
				t.Fatal("rewind ls succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			for _, w := range tc.refuse {
				if strings.Contains(err.Error(), w) {
					t.Errorf("error %q has %q", err, w)
				}
			}
		})
	}
}
