package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/transport"
)

// TestDaemonRefusesAnotherRolesCertificate: a daemon whose certificate
// directory holds another role's certificate (an operator's, from the
// $REWIND_TLS_DIR of the shell that ran the operator commands) or another
// node's refuses to start, naming the directory, whose certificate it is
// and what it needs; one with its own role's starts.
func TestDaemonRefusesAnotherRolesCertificate(t *testing.T) {
	operator := testcluster.TLSDir(t, testcluster.OperatorID)
	coordinator := testcluster.TLSDir(t, testcluster.CoordinatorID)
	n1 := testcluster.TLSDir(t, transport.Identity{Role: transport.RoleNode, Name: "n1"})
	n2 := testcluster.TLSDir(t, transport.Identity{Role: transport.RoleNode, Name: "n2"})
	shared := testcluster.TLSDir(t, testcluster.NodeID)
	agent := func(args ...string) []string {
		return append([]string{"--node", "n1", "--shm-root", filepath.Join(testcluster.ShmDir(t), "shm"),
			"--socket", filepath.Join(t.TempDir(), "a.sock"), "--listen", "", "--metrics", "", "--gossip", ""}, args...)
	}
	coord := func(args ...string) []string {
		return append([]string{"--data", filepath.Join(t.TempDir(), "c"), "--listen", "127.0.0.1:0", "--metrics", "", "--gossip", ""}, args...)
	}
	type testcase struct {
		run  func(context.Context, []string) error
		args []string
		env  string   // $REWIND_TLS_DIR
		want []string // in the error; none: it starts
	}
	run := func(t *testing.T, tc testcase) {
		t.Setenv(EnvTLSDir, tc.env)
		_, err := captureAll(t, tc.run, tc.args...)
		refused := err != nil && strings.Contains(err.Error(), "the certificate in")
		switch {
		case len(tc.want) == 0 && refused:
			t.Fatalf("refused: %v", err)
		case len(tc.want) == 0:
			t.Logf("started (returned %v)", err)
			return
		case !refused:
			t.Fatalf("started with another's certificate (err %v)", err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q lacks %q", err, w)
			}
		}
	}
	for name, tc := range map[string]testcase{
		"agent, an operator's from the environment": {runAgent, agent(), operator,
			[]string{operator, "$REWIND_TLS_DIR", "operator/test-operator's", "node n1", "node/n1"}},
		"agent, another node's":    {runAgent, agent("--tls-dir", n2), "", []string{n2, "(--tls-dir)", "node/n2's", "node/n1"}},
		"agent, the coordinator's": {runAgent, agent("--tls-dir", coordinator), "", []string{"coordinator/coordinator's"}},
		"agent, its own node's":    {runAgent, agent("--tls-dir", n1), operator, nil},
		"agent, every node's":      {runAgent, agent(), shared, nil},
		"coordinator, a node's":    {runCoordinator, coord("--tls-dir", n1), "", []string{n1, "node/n1's", "needs a coordinator's"}},
		"coordinator, a reader's":  {runCoordinator, coord(), testcluster.TLSDir(t, testcluster.ReaderID), []string{"reader/test-reader's"}},
		"coordinator, its own":     {runCoordinator, coord(), coordinator, nil},
	} {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}
