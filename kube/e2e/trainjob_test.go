package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"rewind.dev/rewind/internal/kubetest"
	"rewind.dev/rewind/kube"
)

// TestTrainJob runs the project's example TrainJob
// (deploy/examples/trainjob-train.yaml: 2 nodes × 1 process on the stock
// torch-distributed runtime) under the real Kubeflow Trainer controller,
// which builds its JobSet, and the real JobSet controller, which runs it;
// rewind's controller runs as the chart's ServiceAccount. The TrainJob's
// annotations reach rewind through the JobSet: the job registered, an
// operator restore on the JobSet, a node lost and every rank restored
// bit-identically, with the TrainJob still the JobSet's owner.
func TestTrainJob(t *testing.T) {
	e := setup(t)
	e.installJobSet()
	e.installTrainer()
	e.cluster.SetRunPod(e.torchrun)
	e.useCoordinator(e.runCoordinator("coordinator-0", nil).addr)
	for i := range 3 {
		e.addNode(fmt.Sprintf("node-%d", i))
	}
	for _, phase := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"registered", func(t *testing.T) {
			e.registerExample(t, "deploy/examples/trainjob-train.yaml", "JobSet", 2)
			e.ownedByTrainJob(t)
		}},
		{"operator restore", func(t *testing.T) { e.restoreByAnnotation(t, kube.JobSets, "JobSet", 2) }},
		{"node lost", func(t *testing.T) {
			e.loseNode(t, "JobSet", 2, func() map[string]corev1.Pod { return e.trainJobPods("default", "train") }, "1")
			e.ownedByTrainJob(t)
		}},
	} {
		ok := t.Run(phase.name, phase.run)
		e.t = t
		if !ok {
			t.FailNow()
		}
	}
	if f := e.forbidden(); len(f) > 0 {
		t.Errorf("the API server refused the controller (the chart's RBAC is short):\n%s", strings.Join(f, "\n"))
	}
}

// trainJobs are Kubeflow Trainer v2's TrainJobs.
var trainJobs = schema.GroupVersionResource{Group: "trainer.kubeflow.org", Version: "v1alpha1", Resource: "trainjobs"}

// installTrainer applies the Trainer's CRDs and its torch-distributed
// ClusterTrainingRuntime (from its module, as make kube-bin copies them)
// and starts the real Trainer controller.
func (e *env) installTrainer() {
	bins, _ := kubetest.BinariesFromEnv()
	dir := bins.TrainerManifests()
	for _, res := range []string{"trainjobs", "trainingruntimes", "clustertrainingruntimes"} {
		e.applyCRD(filepath.Join(dir, "trainer.kubeflow.org_"+res+".yaml"),
			schema.GroupVersionResource{Group: "trainer.kubeflow.org", Version: "v1alpha1", Resource: res})
	}
	e.applyPath(filepath.Join(dir, "torch_distributed.yaml"))
	e.cp.StartTrainer()
}

// ownedByTrainJob checks that the JobSet default/train is the TrainJob's
// (its controller owner) and that the TrainJob is not Failed: rewind's
// work on the JobSet did not fight the Trainer.
func (e *env) ownedByTrainJob(t *testing.T) {
	js, err := e.cp.Dyn.Resource(kube.JobSets).Namespace("default").Get(e.ctx, "train", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owner := metav1.GetControllerOf(js)
	if owner == nil || owner.Kind != "TrainJob" || owner.Name != "train" {
		t.Fatalf("JobSet default/train controlled by %v, want the TrainJob train", owner)
	}
	tj, err := e.cp.Dyn.Resource(trainJobs).Namespace("default").Get(e.ctx, "train", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conds, _, _ := unstructured.NestedSlice(tj.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == "Failed" && m["status"] == "True" {
			t.Fatalf("TrainJob default/train Failed: %v", m)
		}
	}
}

// trainJobPods returns the live pods of the TrainJob's JobSet name (not
// being deleted) by torchrun node rank: the trainer Job's completion
// index.
func (e *env) trainJobPods(ns, name string) map[string]corev1.Pod {
	out := map[string]corev1.Pod{}
	for _, p := range e.setPods(ns, name) {
		if p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
			out[p.Annotations["batch.kubernetes.io/job-completion-index"]] = p
		}
	}
	return out
}
