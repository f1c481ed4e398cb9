package kube

import (
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"rewind.dev/rewind/api/coordpb"
)

// rewind.dev/restore-step restores that step and restarts the gang to
// resume from it; the annotation is removed and the result recorded, so a
// second look (a stale cache, a new leader) restores nothing again.
func TestOperatorRestoreByAnnotation(t *testing.T) {
	type testcase struct {
		value    string
		wantCall string // the coordinator's Restore call
		wantStep string // rewind.dev/restoring-step afterwards
	}
	run := func(t *testing.T, tc testcase) {
		ann := map[string]string{AnnCheckpoint: "enabled", AnnRestoreStep: tc.value}
		h := newHarness(t, newMPIJob("ml", "train", 2, 1, ann), newLauncherJob("ml", "train"),
			newPod("ml", "train", roleWorker, 0, "n1"), newPod("ml", "train", roleWorker, 1, "n2"),
			newPod("ml", "train", roleLauncher, 0, "n1"))
		h.syncJob("ml/train")
		h.syncJob("ml/train") // the cache still shows the annotation
		_, _, restores := h.coord.snapshot()
		if len(restores) != 1 || !strings.HasPrefix(restores[0], tc.wantCall) {
			t.Fatalf("restores %q, want one %q", restores, tc.wantCall)
		}
		got := h.mpiJob("ml", "train").GetAnnotations()
		if _, ok := got[AnnRestoreStep]; ok {
			t.Fatalf("%s still set: %v", AnnRestoreStep, got)
		}
		if got[AnnRestoringStep] != tc.wantStep || !strings.Contains(got[AnnRestoreResult], "restored step "+tc.wantStep) {
			t.Fatalf("annotations %v, want %s=%s and the result", got, AnnRestoringStep, tc.wantStep)
		}
		if pods := h.podNames("ml"); len(pods) != 0 {
			t.Fatalf("pods %v left: the gang was not restarted", pods)
		}
		ev := h.events()
		if !hasEvent(ev, "Normal "+ReasonRestored, "step "+tc.wantStep, "kind=MPIJob") || !hasEvent(ev, "Normal "+ReasonRegang, "operator restore") {
			t.Fatalf("events %q, want Restored and Regang", ev)
		}
	}
	for name, tc := range map[string]testcase{
		"step":   {value: "5", wantCall: "ml.train 5 ", wantStep: "5"},
		"latest": {value: "latest", wantCall: "ml.train -1 ", wantStep: "42"},
	} {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

// A restore the coordinator cannot run is reported; the gang keeps
// running and the annotation is removed (asking again retries).
func TestOperatorRestoreFails(t *testing.T) {
	ann := map[string]string{AnnCheckpoint: "enabled", AnnRestoreStep: "9"}
	h := newHarness(t, newMPIJob("ml", "train", 1, 1, ann), newPod("ml", "train", roleWorker, 0, "n1"))
	h.coord.restoreErr = errors.New("step 9 is not consistent")
	h.syncJob("ml/train")
	if ev := h.events(); !hasEvent(ev, "Warning "+ReasonRestoreFailed, "step 9", "not consistent") {
		t.Fatalf("events %q, want RestoreFailed", ev)
	}
	got := h.mpiJob("ml", "train").GetAnnotations()
	if _, ok := got[AnnRestoreStep]; ok || !strings.HasPrefix(got[AnnRestoreResult], "failed") || got[AnnRestoringStep] != "" {
		t.Fatalf("annotations %v", got)
	}
	if pods := h.podNames("ml"); !slices.Equal(pods, []string{"train-worker-0"}) {
		t.Fatalf("pods %v, want the gang untouched", pods)
	}
}

// The driver refuses a recovery of another job than its MPIJob's (the
// coordinator's id of ml/train is ml.train) and restarts a gang once per
// recovery id.
func TestDriverRegang(t *testing.T) {
	h := newHarness(t, newMPIJob("ml", "train", 1, 1, map[string]string{AnnCheckpoint: "enabled"}),
		newPod("ml", "train", roleWorker, 0, "n1"), newNode("n1", corev1.ConditionTrue, t0))
	d := h.c.driver.For("ml", "train")
	for _, job := range []string{"train", "ml/train", "ml.train2", "other.train"} {
		if err := d.Regang(h.ctx, &coordpb.JobEvent{Job: job, Step: 3}); err == nil {
			t.Fatalf("regang of MPIJob ml/train for job %q succeeded", job)
		}
	}
	// Failure detection declared n1 dead while its Ready condition is
	// still True: the driver taints it, so the new gang goes elsewhere.
	ev := &coordpb.JobEvent{Job: "ml.train", Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Ok: true, Step: 3, DetectedUnixNano: 99, Node: "n1"}
	for range 2 {
		if err := d.Regang(h.ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	got := h.mpiJob("ml", "train").GetAnnotations()
	if got[AnnRestoringStep] != "3" || got[AnnRegangID] != "recovery-99" {
		t.Fatalf("annotations %v", got)
	}
	if ev := h.events(); len(ev) != 2 || !hasEvent(ev, "Normal Regang") || !hasEvent(ev, "Warning "+ReasonNodeDown, "declared dead") {
		t.Fatalf("events %v, want one Regang and one NodeDown", ev)
	}
	n, err := h.kube.CoreV1().Nodes().Get(h.ctx, "n1", metav1.GetOptions{})
	if err != nil || !hasTaint(n, TaintUnhealthy) {
		t.Fatalf("node n1 after the regang: %v %v", n.Spec.Taints, err)
	}
}
