package kube

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// After a re-gang the recreated workers land where the scheduler puts
// them: once every rank's new pod is placed, the step is restored onto
// that placement, once; the old pods still in the cache do not count.
func TestShardsPlacedAfterRegang(t *testing.T) {
	ann := map[string]string{AnnCheckpoint: "enabled"}
	old0, old1 := newPod("ml", "train", roleWorker, 0, "n1"), newPod("ml", "train", roleWorker, 1, "n2")
	old0.CreationTimestamp = metav1.NewTime(t0.Add(-time.Hour))
	old1.CreationTimestamp = old0.CreationTimestamp
	h := newHarness(t, newMPIJob("ml", "train", 2, 1, ann), old0, old1)
	h.clock.Step(time.Minute)
	if err := h.c.driver.restart(h.ctx, mpiJobs, h.mpiJob("ml", "train"), 7, "recovery-1", "test", "", false); err != nil {
		t.Fatal(err)
	}
	h.seed(h.c, h.mpiJob("ml", "train"))
	h.syncJob("ml/train") // the cache still has the old pods
	if _, _, restores := h.coord.snapshot(); len(restores) != 0 {
		t.Fatalf("restored onto the old pods: %v", restores)
	}

	created := metav1.NewTime(h.clock.Now().Add(time.Second))
	for i, node := range []string{"n3", "n2"} {
		p := newPod("ml", "train", roleWorker, i, node)
		p.Name += "-new"
		p.CreationTimestamp = created
		h.seed(h.c, p)
	}
	if err := h.c.kubeInformers.Core().V1().Pods().Informer().GetIndexer().Delete(old0); err != nil {
		t.Fatal(err)
	}
	h.syncJob("ml/train")
	reg, _, restores := h.coord.snapshot()
	if len(restores) != 1 || !strings.HasPrefix(restores[0], "ml.train 7 ") {
		t.Fatalf("restores %q, want one of step 7", restores)
	}
	if last := reg[len(reg)-1]; last.Placement[0] != "n3" || last.Placement[1] != "n2" {
		t.Fatalf("registered placement %v, want the new pods' nodes", last.Placement)
	}
	got := h.mpiJob("ml", "train")
	if got.GetAnnotations()[AnnPlacedID] != "recovery-1" {
		t.Fatalf("annotations %v", got.GetAnnotations())
	}
	if ev := h.events(); !hasEvent(ev, "Normal "+ReasonShardsPlaced, "step 7") {
		t.Fatalf("events %q", ev)
	}
	h.seed(h.c, got)
	h.syncJob("ml/train")
	if _, _, restores := h.coord.snapshot(); len(restores) != 1 {
		t.Fatalf("restores %q, want still one", restores)
	}
}
