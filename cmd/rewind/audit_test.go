package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
)

// auditAs runs `rewind audit` with the certificate in dir (under the
// cluster's) and args, its output piped: one line per call, fields
// separated by tabs.
func (c *secureCluster) auditAs(t *testing.T, dir string, args ...string) ([][]string, error) {
	t.Helper()
	args = append([]string{"audit", "--coordinator", c.coordAddr, "--tls-dir", filepath.Join(c.certs, dir)}, args...)
	out, err := exec.Command(testcluster.Binary(t, testcluster.RewindPackage), args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("rewind %v: %w\n%s", args, err, out)
	}
	var rows [][]string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" {
			rows = append(rows, strings.Split(l, "\t"))
		}
	}
	return rows, nil
}

// findRow returns the first row whose caller, method, job, step and
// outcome start as given ("" matches anything).
func findRow(rows [][]string, who, method, job, step, outcome string) []string {
	for _, r := range rows {
		if len(r) == 8 && (who == "" || r[1] == who) && r[2] == method && (job == "" || r[3] == job) &&
			(step == "" || r[4] == step) && strings.HasPrefix(r[7], outcome) {
			return r
		}
	}
	return nil
}

// TestAuditShowsWhoChangedWhat: against a coordinator and an agent
// running with mutual TLS, a node's certificate deleting a step and a
// client with no certificate are refused, and an operator deletes a step;
// `rewind audit`, run by a reader, shows each call with its caller, the
// method and its job and step, and its outcome, and filters by caller and
// job. A rank's save registering its placement (the save path) is not
// recorded; the agent's registration is. A node may not read the audit
// log.
func TestAuditShowsWhoChangedWhat(t *testing.T) {
	c := startSecureCluster(t)
	op, n1 := c.client(t, "operator"), c.client(t, filepath.Join("node", "n1"))
	saveSteps(t, c.socket, c.certs, "j", 1, 2)
	waitLatest(t, op, "j", 2)

	if _, err := n1.DeleteStep(ctxT(t), &coordpb.DeleteStepRequest{Job: "j", Step: 2}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a node deleting a step: %v, want PermissionDenied", err)
	}
	if _, err := coordpb.NewCoordinatorClient(noCertConn(t, c.coordAddr)).NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "n1"}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a caller with no certificate declaring a node down: %v, want Unauthenticated", err)
	}
	if _, err := op.DeleteStep(ctxT(t), &coordpb.DeleteStepRequest{Job: "j", Step: 1}); err != nil {
		t.Fatalf("the operator's delete: %v", err)
	}

	var rows [][]string
	wait.ForNil(t, 20*time.Second, "rewind audit to show the three calls", func() error {
		var err error
		if rows, err = c.auditAs(t, "reader"); err != nil {
			return err
		}
		if findRow(rows, "operator/alice", "DeleteStep", "j", "1", "OK") == nil ||
			findRow(rows, "node/n1", "DeleteStep", "j", "2", "PermissionDenied") == nil ||
			findRow(rows, "", "NodeDown", "", "", "Unauthenticated") == nil {
			return fmt.Errorf("rewind audit shows:\n%q", rows)
		}
		return nil
	})
	if r := findRow(rows, "node/n1", "DeleteStep", "j", "2", "PermissionDenied"); !strings.Contains(r[7], "operator, coordinator only") {
		t.Errorf("the refusal's outcome does not say why: %q", r)
	}
	if r := findRow(rows, "", "NodeDown", "", "", "Unauthenticated"); !strings.HasPrefix(r[1], "unauthenticated 127.0.0.1:") || r[5] != "n1" {
		t.Errorf("the unauthenticated call's row: %q", r)
	}
	if r := findRow(rows, "node/n1", "Register", "", "", "OK"); r == nil || r[5] != "n1" {
		t.Errorf("the agent's registration is not recorded with its node: %q", rows)
	}
	if r := findRow(rows, "node/n1", "RegisterJob", "", "", "OK"); r != nil {
		t.Errorf("a rank's save registering its own placement is recorded: %q", r)
	}

	mine, err := c.auditAs(t, "operator", "--who", "operator/alice", "--job", "j")
	if err != nil {
		t.Fatal(err)
	}
	if len(mine) != 1 || findRow(mine, "operator/alice", "DeleteStep", "j", "1", "OK") == nil {
		t.Errorf("--who operator/alice --job j shows %q, want the one delete", mine)
	}
	if _, err := c.auditAs(t, filepath.Join("node", "n1")); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Errorf("a node read the audit log: %v", err)
	}
}
