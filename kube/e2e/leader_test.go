package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"rewind.dev/rewind/internal/kubetest"
	"rewind.dev/rewind/kube"
)

// TestLeaderKilledMidRecovery runs two coordinator replicas behind a
// Service (agents reach whichever is Ready, as the chart's Service does)
// with the chart's leader Lease. A node dies; the leader declares it down
// and dies itself in the middle of the recovery (fault point
// coordinator/before-regang: after the shards are restored, before the
// gang is restarted). The other replica takes the lease, its index is
// rebuilt from the agents, and it finishes the recovery: the gang is
// restarted through mpi-operator and every rank resumes bit-identically.
func TestLeaderKilledMidRecovery(t *testing.T) {
	e := setup(t)
	c0 := e.runCoordinator("coordinator-0", []string{"REWIND_FAULTS=coordinator/before-regang=1*exit(137)"}, "--fault-injection")
	e.eventually(60*time.Second, "coordinator-0 to lead", func() error { return ready(c0) })
	c1 := e.runCoordinator("coordinator-1", nil)
	svc := kubeService(t, c0, c1)
	e.useCoordinator(svc)
	for i := range 3 {
		e.addNode(fmt.Sprintf("node-%d", i))
	}
	e.applyFile("deploy/examples/mpijob-train.yaml", nil)
	e.waitEvent("default", "MPIJob", "train", kube.ReasonRegistered, 60*time.Second)
	e.eventually(60*time.Second, "default.train to train past step 5", func() error {
		if s := e.latest("default.train"); s < 5 {
			return fmt.Errorf("latest consistent step %d", s)
		}
		return nil
	})
	if err := ready(c1); err == nil {
		t.Fatal("coordinator-1 is Ready while coordinator-0 leads")
	}
	old := e.workers("default", "train")
	dead := old["train-worker-1"].Spec.NodeName
	before := e.latest("default.train")
	since := e.rankCount()
	killed := time.Now()
	e.cluster.Kill(e.cluster.Node(dead))
	if err := c0.proc.Wait(); err == nil || c0.proc.Cmd.ProcessState.ExitCode() != 137 {
		t.Fatalf("coordinator-0 ended with %v, want the injected exit(137) in the middle of the recovery", err)
	}
	t.Logf("coordinator-0 died mid-recovery %v after the kill", time.Since(killed).Round(time.Millisecond))
	e.eventually(60*time.Second, "coordinator-1 to take the lease", func() error { return ready(c1) })
	lease, err := e.cp.Kube.CoordinationV1().Leases("rewind").Get(e.ctx, "rewind-coordinator", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "coordinator-1" {
		t.Fatalf("lease %v, %v: want coordinator-1 holding it", lease, err)
	}
	t.Logf("coordinator-1 leads %v after the kill", time.Since(killed).Round(time.Millisecond))
	t.Logf("API server: MPIJob: %s", e.waitEvent("default", "MPIJob", "train", kube.ReasonRegang, 90*time.Second, "node "+dead+" down"))
	step := e.resumed("default.train", 4, since, 120*time.Second)
	if step < before {
		t.Fatalf("the ranks resumed step %d, older than %d, consistent before the loss", step, before)
	}
	for name, p := range e.workers("default", "train") {
		if p.UID == old[name].UID || p.Spec.NodeName == dead {
			t.Fatalf("worker %s was not recreated off %s", name, dead)
		}
	}
	t.Logf("every rank resumed step %d (consistent before the loss: %d) bit-identically %v after the node's kill",
		step, before, time.Since(killed).Round(time.Millisecond))
	if f := e.forbidden(); len(f) > 0 {
		t.Errorf("the API server refused the controller (the chart's RBAC is short): %q", f)
	}
}

// kubeService puts the coordinators behind a Service and returns its
// address.
func kubeService(t *testing.T, cs ...*coordinator) string {
	var bs []kubetest.Backend
	for _, c := range cs {
		bs = append(bs, c.backend())
	}
	return kubetest.NewService(t, bs...).Addr
}

// ready is a coordinator's readiness probe.
func ready(c *coordinator) error {
	resp, err := (&http.Client{Timeout: time.Second}).Get(c.readyURL())
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s /readyz: %s", c.identity, resp.Status)
	}
	return nil
}
