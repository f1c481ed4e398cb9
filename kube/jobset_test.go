package kube

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	fakediscovery "k8s.io/client-go/discovery/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"rewind.dev/rewind/api/coordpb"
)

// rjob is a replicatedJob of newJobSet: parallelism 0 leaves it unset.
type rjob struct {
	name                  string
	replicas, parallelism int64
	indexed               bool
}

func newJobSet(ns, name string, ann map[string]string, rjobs ...rjob) *unstructured.Unstructured {
	var list []any
	for _, r := range rjobs {
		spec := map[string]any{}
		if r.parallelism > 0 {
			spec["parallelism"] = r.parallelism
			spec["completions"] = r.parallelism
		}
		if r.indexed {
			spec["completionMode"] = "Indexed"
		}
		list = append(list, map[string]any{"name": r.name, "replicas": r.replicas, "template": map[string]any{"spec": spec}})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
		"metadata": map[string]any{"namespace": ns, "name": name, "resourceVersion": "10"},
		"spec":     map[string]any{"replicatedJobs": list},
	}}
	u.SetAnnotations(ann)
	return u
}

// newJobSetPod is the pod of completion index k of Job i of replicatedJob
// r, as the JobSet and Job controllers label it (restart attempt 0).
func newJobSetPod(ns, js, r string, i, k int, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%s-%d-%d-x", js, r, i, k), Labels: map[string]string{
			labelJobSetName: js, labelReplicatedJobName: r, labelJobSetJobIndex: strconv.Itoa(i),
			labelCompletionIndex: strconv.Itoa(k), labelRestartAttempt: "0",
		}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func newChildJob(ns, js, r string, i int) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%s-%d", js, r, i),
		Labels:          map[string]string{labelJobSetName: js, labelReplicatedJobName: r},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: js, Controller: ptr.To(true)}},
	}}
}

// A JobSet's ranks: pods numbered across its replicatedJobs in spec
// order (job index × parallelism + completion index), procs-per-pod ranks
// each; pods of an earlier restart attempt, failed or unscheduled ones
// place nothing.
func TestJobSetRanks(t *testing.T) {
	js := newJobSet("ml", "t", map[string]string{AnnProcsPerPod: "2"},
		rjob{name: "driver", replicas: 1}, rjob{name: "workers", replicas: 2, parallelism: 2, indexed: true})
	s, err := jobSets.shapeOf(js)
	if err != nil {
		t.Fatal(err)
	}
	if s.worldSize() != 10 || s.String() != "5 pods × 2 processes" {
		t.Fatalf("shape %v, world size %d; want 5 pods × 2 processes, 10 ranks", s, s.worldSize())
	}
	old := newJobSetPod("ml", "t", "workers", 0, 0, "stale")
	old.Labels[labelRestartAttempt] = "-1"
	failed := newJobSetPod("ml", "t", "workers", 1, 1, "n9")
	failed.Status.Phase = corev1.PodFailed
	pods := []*corev1.Pod{
		old, failed,
		newJobSetPod("ml", "t", "driver", 0, 0, "n0"),
		newJobSetPod("ml", "t", "workers", 0, 0, "n1"),
		newJobSetPod("ml", "t", "workers", 0, 1, "n2"),
		newJobSetPod("ml", "t", "workers", 1, 0, "n3"),
	}
	got, complete := s.placement(pods)
	want := map[uint32]string{0: "n0", 1: "n0", 2: "n1", 3: "n1", 4: "n2", 5: "n2", 6: "n3", 7: "n3"}
	if complete || !maps.Equal(got, want) {
		t.Fatalf("placement %v complete %v, want %v, incomplete (pod 4 failed)", got, complete, want)
	}
	pods = append(pods, newJobSetPod("ml", "t", "workers", 1, 1, "n4"))
	if got, complete = s.placement(pods); !complete || got[8] != "n4" || got[9] != "n4" {
		t.Fatalf("placement %v complete %v, want ranks 8, 9 on n4 and complete", got, complete)
	}
}

// A managed JobSet is registered as NAMESPACE.NAME with its ranks; what
// does not make ranks is refused with an Event and nothing else.
func TestJobSetRegistration(t *testing.T) {
	type testcase struct {
		js     *unstructured.Unstructured
		objs   []runtime.Object
		reason string // the Warning, or "" for registered
	}
	on := func(extra ...string) map[string]string {
		m := map[string]string{AnnCheckpoint: "enabled"}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	run := func(t *testing.T, tc testcase) {
		objs := append([]runtime.Object{tc.js,
			newJobSetPod("ml", "train", "node", 0, 0, "n1"), newJobSetPod("ml", "train", "node", 1, 0, "n2")}, tc.objs...)
		h := newHarness(t, objs...)
		if err := h.c.syncWorkload(h.ctx, item{jobSet: true, key: "ml/train"}); err != nil {
			t.Fatal(err)
		}
		reg, _, _ := h.coord.snapshot()
		evs := h.events()
		if tc.reason != "" {
			if len(reg) != 0 || len(evs) != 1 || !hasEvent(evs, "Warning", tc.reason) {
				t.Fatalf("registered %v, events %q; want only a Warning %s", reg, evs, tc.reason)
			}
			return
		}
		if len(reg) != 1 || reg[0].Job != "ml.train" || reg[0].WorldSize != 2 || reg[0].Placement[0] != "n1" || reg[0].Placement[1] != "n2" {
			t.Fatalf("registered %v, want ml.train, 2 ranks on n1, n2", reg)
		}
		if !hasEvent(evs, "Normal", ReasonRegistered, "ml.train", "2 ranks (2 pods × 1 processes)") {
			t.Fatalf("events %q", evs)
		}
	}
	for name, tc := range map[string]testcase{
		"registered": {js: newJobSet("ml", "train", on(), rjob{name: "node", replicas: 2})},
		"procs-per-pod not a number": {js: newJobSet("ml", "train", on(AnnProcsPerPod, "two"), rjob{name: "node", replicas: 2}),
			reason: ReasonInvalidAnnotation},
		"parallel pods not indexed": {js: newJobSet("ml", "train", on(), rjob{name: "node", replicas: 2, parallelism: 2}),
			reason: ReasonInvalidSpec},
		"no replicatedJobs": {js: newJobSet("ml", "train", on()), reason: ReasonInvalidSpec},
		"an MPIJob has its job id": {js: newJobSet("ml", "train", on(), rjob{name: "node", replicas: 2}),
			objs: []runtime.Object{newMPIJob("ml", "train", 1, 1, on())}, reason: ReasonInvalidSpec},
	} {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

// A re-gang deletes the set's current child Jobs (background
// propagation: the JobSet controller recreates them at once under their
// names) and then their pods, a dead node's with no grace period; Jobs
// the JobSet does not own are left alone. A finished JobSet is not
// restarted: the JobSet controller would not recreate it.
func TestJobSetRegang(t *testing.T) {
	foreign := newChildJob("ml", "train", "node", 9)
	foreign.OwnerReferences = nil
	js := newJobSet("ml", "train", map[string]string{AnnCheckpoint: "enabled"}, rjob{name: "node", replicas: 2})
	h := newHarness(t, js, newChildJob("ml", "train", "node", 0), newChildJob("ml", "train", "node", 1), foreign,
		newJobSetPod("ml", "train", "node", 0, 0, "n1"), newJobSetPod("ml", "train", "node", 1, 0, "n2"),
		newNode("n1", corev1.ConditionTrue, t0), newNode("n2", corev1.ConditionUnknown, t0))
	ev := &coordpb.JobEvent{Job: "ml.train", Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Ok: true, Step: 3, DetectedUnixNano: 1, Node: "n2"}
	if err := h.c.driver.ForJobSet("ml", "train").Regang(h.ctx, ev); err != nil {
		t.Fatal(err)
	}
	want := []deletion{{"jobs/train-node-0", ""}, {"jobs/train-node-1", ""}, {"pods/train-node-0-0-x", ""}, {"pods/train-node-1-0-x", "0s"}}
	if got := deletions(h); !slices.Equal(got, want) {
		t.Fatalf("deletions\n%v\nwant\n%v", got, want)
	}
	js, err := h.dyn.Resource(JobSets).Namespace("ml").Get(h.ctx, "train", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ann := js.GetAnnotations()
	if ann[AnnRestoringStep] != "3" || ann[AnnRegangID] != "recovery-1" {
		t.Fatalf("annotations %v", ann)
	}
	if !hasEvent(h.events(), "Normal", ReasonRegang, "restore step 3", "(child Jobs, pods) deleted for the JobSet controller to recreate") {
		t.Fatal("no Regang event")
	}

	done := newJobSet("ml", "done", map[string]string{AnnCheckpoint: "enabled"}, rjob{name: "node", replicas: 1})
	_ = unstructured.SetNestedSlice(done.Object, []any{map[string]any{"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}}, "status", "conditions")
	h = newHarness(t, done, newChildJob("ml", "done", "node", 0))
	if err := h.c.driver.ForJobSet("ml", "done").Regang(h.ctx, &coordpb.JobEvent{Job: "ml.done", Step: 3, DetectedUnixNano: 1}); err != nil {
		t.Fatal(err)
	}
	if d := deletions(h); len(d) != 0 || !hasEvent(h.events(), "Warning", ReasonRegangImpossible, "Completed (AllJobsCompleted)") {
		t.Fatalf("a finished JobSet: deletions %v", d)
	}
}

// JobSets are managed only when the API server serves them: an informer
// of a resource that is not served never syncs.
func TestServesJobSets(t *testing.T) {
	kube := kubefake.NewClientset()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if servesJobSets(kube.Discovery(), log) {
		t.Fatal("JobSets served with no JobSet CRD")
	}
	kube.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{
		{GroupVersion: "jobset.x-k8s.io/v1alpha2", APIResources: []metav1.APIResource{{Name: "jobsets", Namespaced: true, Kind: "JobSet"}}},
	}
	if !servesJobSets(kube.Discovery(), log) {
		t.Fatal("JobSets not seen with the JobSet CRD installed")
	}
}

// trainJobSet is a JobSet as Kubeflow Trainer v2 builds it for a TrainJob
// of nodes nodes with PET_NPROC_PER_NODE procs: a dataset initializer,
// then the trainer's Indexed Job "node" (torchrun's node rank is a pod's
// completion index).
func trainJobSet(nodes int64, procs string, ann map[string]string) *unstructured.Unstructured {
	step := func(s string) map[string]any { return map[string]any{"labels": map[string]any{labelTrainerStep: s}} }
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
		"metadata": map[string]any{"namespace": "ml", "name": "tune", "resourceVersion": "10"},
		"spec": map[string]any{"replicatedJobs": []any{
			map[string]any{"name": "dataset-initializer", "replicas": int64(1), "template": map[string]any{"metadata": step("dataset-initializer")}},
			map[string]any{"name": "node", "replicas": int64(1), "template": map[string]any{"metadata": step(trainerStep), "spec": map[string]any{
				"parallelism": nodes, "completions": nodes, "completionMode": "Indexed",
				"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "node",
					"env": []any{map[string]any{"name": envNprocPerNode, "value": procs}}}}}},
			}}},
		}},
	}}
	u.SetAnnotations(ann)
	return u
}

// A TrainJob's JobSet: only the trainer step's pods run ranks (the
// initializers none), numbered by completion index, PET_NPROC_PER_NODE
// ranks each unless rewind.dev/procs-per-pod says otherwise; a
// PET_NPROC_PER_NODE that is not a number needs the annotation.
func TestTrainJobSetRanks(t *testing.T) {
	s, err := jobSets.shapeOf(trainJobSet(3, "2", nil))
	if err != nil {
		t.Fatal(err)
	}
	if s.worldSize() != 6 {
		t.Fatalf("world size %d (%v), want 3 nodes × 2", s.worldSize(), s)
	}
	pods := []*corev1.Pod{newJobSetPod("ml", "tune", "dataset-initializer", 0, 0, "n9")}
	for k := range 3 {
		pods = append(pods, newJobSetPod("ml", "tune", "node", 0, k, fmt.Sprintf("n%d", k)))
	}
	got, complete := s.placement(pods)
	if want := map[uint32]string{0: "n0", 1: "n0", 2: "n1", 3: "n1", 4: "n2", 5: "n2"}; !complete || !maps.Equal(got, want) {
		t.Fatalf("placement %v complete %v, want %v", got, complete, want)
	}
	if _, err := jobSets.shapeOf(trainJobSet(3, "auto", nil)); err == nil {
		t.Fatal("PET_NPROC_PER_NODE=auto and no rewind.dev/procs-per-pod: accepted")
	}
	if s, err := jobSets.shapeOf(trainJobSet(3, "auto", map[string]string{AnnProcsPerPod: "8"})); err != nil || s.worldSize() != 24 {
		t.Fatalf("procs-per-pod 8 over auto: %v, %v; want 24 ranks", s, err)
	}
}

// A TrainJob's re-gang restarts its trainer step only: the initializers'
// Jobs (done before training began) are not run again.
func TestTrainJobSetRegangKeepsInitializers(t *testing.T) {
	h := newHarness(t, trainJobSet(2, "1", map[string]string{AnnCheckpoint: "enabled"}),
		newChildJob("ml", "tune", "dataset-initializer", 0), newChildJob("ml", "tune", "node", 0),
		newJobSetPod("ml", "tune", "dataset-initializer", 0, 0, "n1"),
		newJobSetPod("ml", "tune", "node", 0, 0, "n1"), newJobSetPod("ml", "tune", "node", 0, 1, "n2"),
		newNode("n1", corev1.ConditionTrue, t0), newNode("n2", corev1.ConditionTrue, t0))
	ev := &coordpb.JobEvent{Job: "ml.tune", Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Ok: true, Step: 3, DetectedUnixNano: 1}
	if err := h.c.driver.ForJobSet("ml", "tune").Regang(h.ctx, ev); err != nil {
		t.Fatal(err)
	}
	want := []deletion{{"jobs/tune-node-0", ""}, {"pods/tune-node-0-0-x", ""}, {"pods/tune-node-0-1-x", ""}}
	if got := deletions(h); !slices.Equal(got, want) {
		t.Fatalf("deletions\n%v\nwant\n%v", got, want)
	}
}
