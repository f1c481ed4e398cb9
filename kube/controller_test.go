package kube

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
)

// An annotated MPIJob is registered with its ranks placed on its worker
// pods' nodes (worker index × slots + local rank) and its recoveries are
// followed; an MPIJob without the annotation is left alone.
func TestManagedAndUnmanagedJobs(t *testing.T) {
	ann := map[string]string{AnnCheckpoint: "enabled", AnnPolicy: "nvme:every=10,keep=2", AnnReplicas: "1"}
	h := newHarness(t,
		newMPIJob("ml", "train", 2, 2, ann),
		newPod("ml", "train", roleWorker, 0, "n1"), newPod("ml", "train", roleWorker, 1, "n2"),
		newPod("ml", "train", roleLauncher, 0, "n3"),
		newMPIJob("ml", "plain", 2, 1, map[string]string{AnnCheckpoint: "disabled"}),
		newPod("ml", "plain", roleWorker, 0, "n1"),
	)
	h.syncJob("ml/train")
	h.syncJob("ml/plain")
	reg, _, _ := h.coord.snapshot()
	if len(reg) != 1 {
		t.Fatalf("%d registrations, want 1 (the annotated job only): %v", len(reg), reg)
	}
	r := reg[0]
	want := map[uint32]string{0: "n1", 1: "n1", 2: "n2", 3: "n2"}
	if r.Job != "ml.train" || r.WorldSize != 4 || !maps.Equal(r.Placement, want) || r.Policy != ann[AnnPolicy] || r.Replicas == nil || *r.Replicas != 1 {
		t.Fatalf("registered %v, want ml.train of 4 ranks on %v with the annotations' policy and replicas", r, want)
	}
	if job := <-h.coord.follows; job != "ml.train" {
		t.Fatalf("following %s, want ml.train", job)
	}
	if ev := h.events(); len(ev) != 1 || !hasEvent(ev, "Normal Registered", "4 ranks", "kind=MPIJob") {
		t.Fatalf("events %q, want one Registered on the MPIJob", ev)
	}

	// Nothing changed: nothing sent again. A worker moved: sent again.
	h.syncJob("ml/train")
	h.seed(h.c, newPod("ml", "train", roleWorker, 1, "n4"))
	h.syncJob("ml/train")
	reg, _, _ = h.coord.snapshot()
	if len(reg) != 2 || reg[1].Placement[3] != "n4" {
		t.Fatalf("registrations %v, want a second one with rank 3 on n4", reg)
	}

	// The annotation removed: no longer followed.
	h.seed(h.c, newMPIJob("ml", "train", 2, 2, nil))
	h.syncJob("ml/train")
	h.c.mu.Lock()
	n := len(h.c.followers)
	h.c.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d jobs still followed after the annotation was removed", n)
	}
}

// A bad annotation value is reported on the MPIJob naming the key and the
// problem, once, and nothing is done: no registration, no restore, no pod
// touched.
func TestBadAnnotations(t *testing.T) {
	type testcase struct {
		key, value, problem string
	}
	run := func(t *testing.T, tc testcase) {
		ann := map[string]string{AnnCheckpoint: "enabled", tc.key: tc.value}
		h := newHarness(t, newMPIJob("ml", "train", 2, 1, ann),
			newPod("ml", "train", roleWorker, 0, "n1"), newPod("ml", "train", roleWorker, 1, "n2"))
		h.syncJob("ml/train")
		h.syncJob("ml/train")
		ev := h.events()
		if len(ev) != 1 || !hasEvent(ev, "Warning "+ReasonInvalidAnnotation, tc.key, tc.problem, "kind=MPIJob") {
			t.Fatalf("events %q, want one InvalidAnnotation naming %s and %q", ev, tc.key, tc.problem)
		}
		reg, downs, restores := h.coord.snapshot()
		if len(reg)+len(downs)+len(restores) != 0 {
			t.Fatalf("acted on a job with a bad annotation: %v %v %v", reg, downs, restores)
		}
		if pods := h.podNames("ml"); len(pods) != 2 {
			t.Fatalf("pods %v touched", pods)
		}
		if got := h.mpiJob("ml", "train").GetAnnotations(); !maps.Equal(got, ann) {
			t.Fatalf("annotations changed to %v", got)
		}
	}
	for name, tc := range map[string]testcase{
		"replicas":     {AnnReplicas, "lots", "whole number"},
		"policy":       {AnnPolicy, "tape:every=1", ""},
		"restore step": {AnnRestoreStep, "yesterday", "not a step number"},
	} {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

// An MPIJob whose spec rewind cannot place ranks for is reported, not
// registered: one with no workers, and one with runLauncherAsWorker (its
// ranks would start on the launcher, the hostfile's first entry).
func TestBadSpec(t *testing.T) {
	for _, tc := range []struct {
		name, names string
		workers     int64
		edit        func(*unstructured.Unstructured) error
	}{
		{"no workers", "Worker.replicas", 0, nil},
		{"launcher as worker", "runLauncherAsWorker", 2, func(u *unstructured.Unstructured) error {
			return unstructured.SetNestedField(u.Object, true, "spec", "runLauncherAsWorker")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newMPIJob("ml", "train", tc.workers, 1, map[string]string{AnnCheckpoint: "enabled"})
			if tc.edit != nil {
				if err := tc.edit(u); err != nil {
					t.Fatal(err)
				}
			}
			h := newHarness(t, u)
			h.syncJob("ml/train")
			if ev := h.events(); !hasEvent(ev, "Warning "+ReasonInvalidSpec, tc.names) {
				t.Fatalf("events %q, want InvalidSpec naming %s", ev, tc.names)
			}
			if reg, _, _ := h.coord.snapshot(); len(reg) != 0 {
				t.Fatalf("registered %v", reg)
			}
		})
	}
}

// A node NotReady for less than the grace is left alone; past it, it is
// declared down once, tainted, and an Event says so, however often it is
// seen afterwards, and by a new leader too.
func TestNodeNotReadyPastGrace(t *testing.T) {
	h := newHarness(t, newNode("n1", corev1.ConditionUnknown, t0), newNode("n2", corev1.ConditionTrue, t0.Add(-time.Hour)))
	grace := h.c.cfg.NodeGrace
	h.clock.Step(grace - time.Second)
	h.syncNode("n1")
	h.syncNode("n2")
	if _, downs, _ := h.coord.snapshot(); len(downs) != 0 {
		t.Fatalf("declared down within the grace: %v", downs)
	}
	h.clock.Step(2 * time.Second)
	h.syncNode("n1")
	h.syncNode("n1") // reported twice, the cache not yet showing the taint
	h.syncNode("n2")
	if _, downs, _ := h.coord.snapshot(); !slices.Equal(downs, []string{"n1"}) {
		t.Fatalf("NodeDown calls %v, want n1 once", downs)
	}
	n, err := h.kube.CoreV1().Nodes().Get(h.ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != TaintUnhealthy || n.Spec.Taints[0].Effect != corev1.TaintEffectNoSchedule {
		t.Fatalf("taints %v, want %s:NoSchedule", n.Spec.Taints, TaintUnhealthy)
	}
	if ev := h.events(); len(ev) != 1 || !hasEvent(ev, "Warning "+ReasonNodeDown, "node n1", "taints it") {
		t.Fatalf("events %q, want one NodeDown on the node", ev)
	}

	// A new leader sees the tainted node: the fault was handled.
	h2 := h.newController()
	h.seed(h2, n)
	if err := h2.syncNode(h.ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, downs, _ := h.coord.snapshot(); len(downs) != 1 {
		t.Fatalf("new leader declared n1 down again: %v", downs)
	}
}

// Without quorum the coordinator refuses: no taint, the sync fails (and is
// retried), and the next try acts.
func TestNodeDownRefused(t *testing.T) {
	h := newHarness(t, newNode("n1", corev1.ConditionFalse, t0))
	h.clock.Step(time.Hour)
	h.coord.nodeErr = errors.New("no quorum")
	if err := h.c.syncNode(h.ctx, "n1"); err == nil || !strings.Contains(err.Error(), "no quorum") {
		t.Fatalf("syncNode = %v, want the coordinator's refusal", err)
	}
	if n, _ := h.kube.CoreV1().Nodes().Get(h.ctx, "n1", metav1.GetOptions{}); len(n.Spec.Taints) != 0 {
		t.Fatalf("tainted although not declared down: %v", n.Spec.Taints)
	}
	h.coord.mu.Lock()
	h.coord.nodeErr = nil
	h.coord.mu.Unlock()
	h.syncNode("n1")
	if _, downs, _ := h.coord.snapshot(); len(downs) != 1 {
		t.Fatalf("NodeDown calls %v, want 1", downs)
	}
}

// A node going NotReady with a managed job on it: the node is declared
// down and tainted, the recovery (delivered twice) restarts the gang once:
// the step to restore is recorded on the MPIJob, the launcher Job and the
// job's pods are deleted, other jobs' pods are not.
func TestNodeFaultRestartsGangOnce(t *testing.T) {
	ann := map[string]string{AnnCheckpoint: "enabled"}
	objs := []runtime.Object{
		newMPIJob("ml", "train", 2, 1, ann), newLauncherJob("ml", "train"),
		newPod("ml", "train", roleWorker, 0, "n1"), newPod("ml", "train", roleWorker, 1, "n2"),
		newPod("ml", "train", roleLauncher, 0, "n2"), newPod("ml", "other", roleWorker, 0, "n1"),
		newNode("n1", corev1.ConditionFalse, t0),
	}
	h := newHarness(t, objs...)
	h.coord.jobsOn["n1"] = []string{"ml.train"}
	h.coord.dupEvents = true
	h.syncJob("ml/train")
	<-h.coord.follows
	h.events()
	h.clock.Step(time.Hour)
	h.syncNode("n1")
	h.syncNode("n1")

	got := h.mpiJob("ml", "train").GetAnnotations()
	if got[AnnRestoringStep] != "7" || got[AnnRegangID] == "" {
		t.Fatalf("annotations %v, want %s=7 and a regang id", got, AnnRestoringStep)
	}
	if pods := h.podNames("ml"); !slices.Equal(pods, []string{"other-worker-0"}) {
		t.Fatalf("pods left %v, want only the other job's", pods)
	}
	if _, err := h.kube.BatchV1().Jobs("ml").Get(h.ctx, "train-launcher", metav1.GetOptions{}); !isNotFound(err) {
		t.Fatalf("launcher Job: %v, want it deleted", err)
	}
	ev := h.events()
	var regangs int
	for _, e := range ev {
		if strings.Contains(e, ReasonRegang) {
			regangs++
		}
	}
	if regangs != 1 || !hasEvent(ev, "Normal Regang", "step 7", "kind=MPIJob") || !hasEvent(ev, ReasonNodeDown) {
		t.Fatalf("events %q, want one NodeDown and one Regang to step 7", ev)
	}
	deletes := 0
	for _, a := range h.kube.Actions() {
		if a.GetVerb() == "delete" {
			deletes++
		}
	}
	if deletes != 4 { // the launcher Job, the launcher pod, two workers
		t.Fatalf("%d deletions, want 4 (one restart)", deletes)
	}
}

// Run wires informers, handlers and the queue: with the informers started
// on the fake clientsets, an annotated MPIJob and an annotated JobSet are
// registered and followed.
func TestRunRegistersFromInformers(t *testing.T) {
	ann := map[string]string{AnnCheckpoint: "enabled"}
	h := newHarness(t)
	h.kube = kubefake.NewClientset(newPod("ml", "train", roleWorker, 0, "n1"), newJobSetPod("ml", "set", "node", 0, 0, "n2"))
	h.dyn = dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{MPIJobs: "MPIJobList", JobSets: "JobSetList"},
		newMPIJob("ml", "train", 1, 1, ann), newJobSet("ml", "set", ann, rjob{name: "node", replicas: 1}))
	c := h.newController()
	done := make(chan error, 1)
	go func() { done <- c.Run(h.ctx) }()
	var follows []string
	for len(follows) < 2 {
		select {
		case job := <-h.coord.follows:
			follows = append(follows, job)
		case <-time.After(10 * time.Second):
			t.Fatalf("the running controller did not pick up the annotated MPIJob and JobSet (following %v)", follows)
		}
	}
	if slices.Sort(follows); !slices.Equal(follows, []string{"ml.set", "ml.train"}) {
		t.Fatalf("following %v", follows)
	}
	reg, _, _ := h.coord.snapshot()
	placed := map[string]string{}
	for _, r := range reg {
		placed[r.Job] = r.Placement[0]
	}
	if len(reg) != 2 || placed["ml.train"] != "n1" || placed["ml.set"] != "n2" {
		t.Fatalf("registered %v, want ml.train's rank 0 on n1, ml.set's on n2", reg)
	}
}

// A node deleted outright (never NotReady first) is declared down at
// once, and once; a node the coordinator never knew is left alone.
func TestNodeDeletedIsDown(t *testing.T) {
	h := newHarness(t)
	h.syncNode("gone") // not in the cache: deleted
	h.syncNode("gone") // seen again: nothing more
	if _, downs, _ := h.coord.snapshot(); !slices.Equal(downs, []string{"gone"}) {
		t.Fatalf("NodeDown calls %v, want the deleted node once", downs)
	}
	h.coord.mu.Lock()
	h.coord.nodeErr = status.Error(codes.NotFound, "coordinator: no node \"stranger\"")
	h.coord.mu.Unlock()
	if err := h.c.syncNode(h.ctx, "stranger"); err != nil {
		t.Fatalf("a deleted node the coordinator never knew: %v", err)
	}
}

// The pod informer lists only MPIJobs' pods (mpi-operator's job-name
// label), not every pod of the cluster.
func TestPodInformerWatchesOnlyMPIJobPods(t *testing.T) {
	kube := kubefake.NewClientset(newPod("ml", "train", roleWorker, 0, "n1"),
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "nginx"}})
	ki, _ := Informers(kube, nil, 0)
	pods := ki.Core().V1().Pods().Lister()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ki.Start(ctx.Done())
	for typ, ok := range ki.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v did not sync", typ)
		}
	}
	got, err := pods.List(labels.Everything())
	if err != nil || len(got) != 1 || got[0].Namespace != "ml" {
		t.Fatalf("pods in the cache: %v %v, want only the MPIJob's worker", got, err)
	}
}
