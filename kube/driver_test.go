package kube

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"rewind.dev/rewind/api/coordpb"
)

// deletion is a delete call the driver made: "pods/NAME" or "jobs/NAME",
// with the grace period it asked for ("" for the pod's own).
type deletion struct {
	what, grace string
}

func deletions(h *harness) []deletion {
	var out []deletion
	for _, a := range h.kube.Actions() {
		d, ok := a.(k8stesting.DeleteActionImpl)
		if !ok {
			continue
		}
		grace := ""
		if g := d.GetDeleteOptions().GracePeriodSeconds; g != nil {
			grace = fmt.Sprintf("%ds", *g)
		}
		out = append(out, deletion{d.GetResource().Resource + "/" + d.GetName(), grace})
	}
	return out
}

// A re-gang after a node's death deletes the workers, then the launcher
// Job, then the launcher's pods; a pod on a dead node (the recovery's, one
// gone from the cluster, one not Ready) is deleted with no grace period,
// since no kubelet will ever confirm its deletion and mpi-operator would
// not recreate a worker whose pod is still there; a pod on a healthy node
// gets its grace period.
func TestRegangDeletesWorkersFirstAndDeadNodesPodsAtOnce(t *testing.T) {
	evicted := newPod("ml", "train", roleWorker, 0, "n1") // taint-based eviction: Terminating on a dead node
	evicted.DeletionTimestamp = &metav1.Time{Time: t0}
	h := newHarness(t, newMPIJob("ml", "train", 4, 1, map[string]string{AnnCheckpoint: "enabled"}), newLauncherJob("ml", "train"),
		evicted,
		newPod("ml", "train", roleWorker, 1, "n2"), // healthy
		newPod("ml", "train", roleWorker, 2, "n3"), // its Node deleted
		newPod("ml", "train", roleWorker, 3, "n4"), // NotReady, not yet declared dead
		newPod("ml", "train", roleLauncher, 0, "n2"),
		newNode("n1", corev1.ConditionUnknown, t0), newNode("n2", corev1.ConditionTrue, t0), newNode("n4", corev1.ConditionFalse, t0))
	ev := &coordpb.JobEvent{Job: "ml.train", Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Ok: true, Step: 3, DetectedUnixNano: 1, Node: "n1"}
	if err := h.c.driver.For("ml", "train").Regang(h.ctx, ev); err != nil {
		t.Fatal(err)
	}
	want := []deletion{
		{"pods/train-worker-0", "0s"}, {"pods/train-worker-1", ""}, {"pods/train-worker-2", "0s"}, {"pods/train-worker-3", "0s"},
		{"jobs/train-launcher", ""}, {"pods/train-launcher-x0", ""},
	}
	if got := deletions(h); !slices.Equal(got, want) {
		t.Fatalf("deletions\n%v\nwant\n%v", got, want)
	}
}

// mpi-operator never recreates the pods of an MPIJob it marked finished
// (a Succeeded or Failed condition and status.completionTime), nor runs
// one whose runPolicy.managedBy names another controller: the driver says
// so on the MPIJob and leaves it alone. A Failed condition without
// completionTime (evicted workers) does not stop mpi-operator: the gang is
// restarted.
func TestRegangOnlyWhatMPIOperatorRecreates(t *testing.T) {
	type testcase struct {
		cond, completion, managedBy string
		restart                     bool
		problem                     string
		already                     bool // this recovery restarted the gang before the job finished
	}
	run := func(t *testing.T, tc testcase) {
		ann := map[string]string{AnnCheckpoint: "enabled"}
		if tc.already {
			ann[AnnRegangID], ann[AnnRegangAt] = "recovery-1", t0.Format(time.RFC3339)
		}
		u := newMPIJob("ml", "train", 1, 1, ann)
		if tc.cond != "" {
			status := map[string]any{"conditions": []any{
				map[string]any{"type": "Created", "status": "True"},
				map[string]any{"type": tc.cond, "status": "True", "reason": "Because"},
			}}
			if tc.completion != "" {
				status["completionTime"] = tc.completion
			}
			u.Object["status"] = status
		}
		if tc.managedBy != "" {
			if err := unstructured.SetNestedField(u.Object, tc.managedBy, "spec", "runPolicy", "managedBy"); err != nil {
				t.Fatal(err)
			}
		}
		h := newHarness(t, u, newLauncherJob("ml", "train"), newPod("ml", "train", roleWorker, 0, "n1"), newNode("n1", corev1.ConditionTrue, t0))
		ev := &coordpb.JobEvent{Job: "ml.train", Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Ok: true, Step: 3, DetectedUnixNano: 1}
		if err := h.c.driver.For("ml", "train").Regang(h.ctx, ev); err != nil {
			t.Fatal(err)
		}
		ann = h.mpiJob("ml", "train").GetAnnotations()
		ev2 := h.events()
		if tc.already {
			if d := deletions(h); len(d)+len(ev2) != 0 {
				t.Fatalf("a recovery delivered again after the job finished: deletions %v, events %q; want none", d, ev2)
			}
			return
		}
		if tc.restart {
			if len(deletions(h)) != 2 || ann[AnnRegangID] == "" || !hasEvent(ev2, "Normal "+ReasonRegang) {
				t.Fatalf("not restarted: deletions %v, annotations %v, events %q", deletions(h), ann, ev2)
			}
			return
		}
		if d := deletions(h); len(d) != 0 || ann[AnnRegangID] != "" {
			t.Fatalf("restarted a gang mpi-operator will not recreate: deletions %v, annotations %v", d, ann)
		}
		if len(ev2) != 1 || !hasEvent(ev2, "Warning "+ReasonRegangImpossible, "step 3", tc.problem) {
			t.Fatalf("events %q, want one %s naming %q", ev2, ReasonRegangImpossible, tc.problem)
		}
	}
	for name, tc := range map[string]testcase{
		"failed":           {cond: "Failed", completion: "2026-11-21T11:00:00Z", problem: "Failed (Because)"},
		"succeeded":        {cond: "Succeeded", completion: "2026-11-21T11:00:00Z", problem: "Succeeded (Because)"},
		"multikueue":       {managedBy: "kueue.x-k8s.io/multikueue", problem: "kueue.x-k8s.io/multikueue"},
		"evicted":          {cond: "Failed", restart: true},
		"running":          {cond: "Running", completion: "2026-11-21T11:00:00Z", restart: true},
		"mpi-operator's":   {managedBy: mpiOperator, restart: true},
		"no status at all": {restart: true},
		"finished since":   {cond: "Succeeded", completion: "2026-11-21T13:00:00Z", already: true},
	} {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

// A restart cut short (here the launcher Job's deletion fails) is
// finished when the recovery is delivered again (the follow starts over,
// or a new leader follows): what is left of the old gang is deleted, what
// mpi-operator created since is not, and the gang is restarted once.
func TestRegangInterruptedIsFinished(t *testing.T) {
	h := newHarness(t, newMPIJob("ml", "train", 2, 1, map[string]string{AnnCheckpoint: "enabled"}), newLauncherJob("ml", "train"),
		newPod("ml", "train", roleWorker, 0, "n1"), newPod("ml", "train", roleWorker, 1, "n2"),
		newPod("ml", "train", roleLauncher, 0, "n2"),
		newNode("n1", corev1.ConditionTrue, t0), newNode("n2", corev1.ConditionTrue, t0))
	fail := true
	h.kube.PrependReactor("delete", "jobs", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fail {
			return true, nil, errors.New("etcdserver: request timed out")
		}
		return false, nil, nil
	})
	ev := &coordpb.JobEvent{Job: "ml.train", Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Ok: true, Step: 3, DetectedUnixNano: 1}
	if err := h.c.driver.For("ml", "train").Regang(h.ctx, ev); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("Regang = %v, want the launcher Job's deletion error", err)
	}
	// mpi-operator recreates the workers meanwhile.
	h.clock.Step(2 * time.Second)
	for i, node := range []string{"n2", "n1"} {
		p := newPod("ml", "train", roleWorker, i, node)
		p.CreationTimestamp = metav1.NewTime(h.clock.Now())
		if err := h.kube.Tracker().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	fail = false
	for range 2 {
		if err := h.c.driver.For("ml", "train").Regang(h.ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if pods := h.podNames("ml"); !slices.Equal(pods, []string{"train-worker-0", "train-worker-1"}) {
		t.Fatalf("pods %v, want the two new workers", pods)
	}
	var got []string
	for _, d := range deletions(h) {
		got = append(got, d.what)
	}
	want := []string{"pods/train-worker-0", "pods/train-worker-1", "jobs/train-launcher", "jobs/train-launcher", "pods/train-launcher-x0"}
	if !slices.Equal(got, want) {
		t.Fatalf("deletions %v, want %v (the failed launcher Job's deletion, then the rest of the old gang, once)", got, want)
	}
	if ev := h.events(); len(ev) != 1 || !hasEvent(ev, "Normal "+ReasonRegang) {
		t.Fatalf("events %q, want one Regang", ev)
	}
}

// A runPolicy.backoffLimit below the Job default is warned about when the
// job is registered: the launcher Job may use it up before a re-gang.
func TestLowBackoffLimitWarned(t *testing.T) {
	type testcase struct {
		limit int64 // < 0: not set
		warn  bool
	}
	run := func(t *testing.T, tc testcase) {
		u := newMPIJob("ml", "train", 1, 1, map[string]string{AnnCheckpoint: "enabled"})
		if tc.limit >= 0 {
			if err := unstructured.SetNestedField(u.Object, tc.limit, "spec", "runPolicy", "backoffLimit"); err != nil {
				t.Fatal(err)
			}
		}
		h := newHarness(t, u, newPod("ml", "train", roleWorker, 0, "n1"))
		h.syncJob("ml/train")
		ev := h.events()
		if got := hasEvent(ev, "Warning "+ReasonRegangAtRisk, "backoffLimit"); got != tc.warn {
			t.Fatalf("events %q: warned %v, want %v", ev, got, tc.warn)
		}
	}
	for name, tc := range map[string]testcase{
		"zero":    {limit: 0, warn: true},
		"two":     {limit: 2, warn: true},
		"default": {limit: -1},
		"six":     {limit: 6},
	} {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}
