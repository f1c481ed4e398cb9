package e2e

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"rewind.dev/rewind/internal/kubetest"
	"rewind.dev/rewind/kube"
	"rewind.dev/rewind/shm"
)

// TestJobSet runs the project's example JobSet
// (deploy/examples/jobset-train.yaml, 2 pods × 1 process, torchrun
// style) on three nodes under the real JobSet controller, with rewind's
// controller running as the chart's ServiceAccount: the job registered,
// an operator restore by annotation, a node lost, the set restarted off
// it and every rank restored bit-identically.
func TestJobSet(t *testing.T) {
	e := setup(t)
	e.installJobSet()
	e.cluster.SetRunPod(e.torchrun)
	e.useCoordinator(e.runCoordinator("coordinator-0", nil).addr)
	for i := range 3 {
		e.addNode(fmt.Sprintf("node-%d", i))
	}
	for _, phase := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"registered", e.jobSetRegistered},
		{"operator restore", func(t *testing.T) { e.restoreByAnnotation(t, kube.JobSets, "JobSet", 2) }},
		{"node lost", e.jobSetNodeLost},
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

// jobSetSteps: the JobSet's ranks train past every phase of the test
// (it has no phase for the job's end), however long a phase takes.
const jobSetSteps = 100000

// installJobSet applies the JobSet CRD (from its module, as make
// kube-bin copies it) and starts the real JobSet controller; before the
// coordinator starts, which watches JobSets only if they are served.
func (e *env) installJobSet() {
	bins, _ := kubetest.BinariesFromEnv()
	e.applyCRD(bins.JobSetCRD(), kube.JobSets)
	e.cp.StartJobSet()
}

// torchrun plays torchrun in a JobSet's pod: PET_NPROC_PER_NODE ranks,
// rank = PET_NODE_RANK × procs + local rank, world size = PET_NNODES ×
// procs, the job from REWIND_NAMESPACE and REWIND_JOB_NAME. Each rank is
// rewind's demo trainer (the example's train.py).
func (e *env) torchrun(r kubetest.PodRun) []*kubetest.Proc {
	num := func(k string) int {
		n, err := strconv.Atoi(r.Env[k])
		if err != nil {
			e.t.Errorf("pod %s: %s=%q: %v", r.Pod.Name, k, r.Env[k], err)
		}
		return n
	}
	nodes, procs, nodeRank := num("PET_NNODES"), num("PET_NPROC_PER_NODE"), num("PET_NODE_RANK")
	job, err := shm.KubeJobFromEnv(func(k string) string { return r.Env[k] })
	if err != nil {
		e.t.Errorf("pod %s: %v", r.Pod.Name, err)
	}
	var out []*kubetest.Proc
	for l := range procs {
		rank := nodeRank*procs + l
		name := fmt.Sprintf("rank-%s-%d-%s", job, rank, r.Pod.UID)
		p := kubetest.RunProc(e.t, e.dir, name, e.trainer(), []string{"demo-train", "--socket", e.sockets[r.Node.Name],
			"--job", job, "--rank", strconv.Itoa(rank), "--world-size", strconv.Itoa(nodes * procs),
			"--steps", strconv.Itoa(jobSetSteps), "--size", "1MiB", "--step-time", stepTime.String()}, nil)
		e.mu.Lock()
		e.ranks = append(e.ranks, &rankRun{job: job, rank: rank, node: r.Node.Name, launcher: r.Pod.Name + "/" + string(r.Pod.UID), log: p.Log, proc: p})
		e.mu.Unlock()
		out = append(out, p)
	}
	return out
}

// jobSetRegistered: the example, applied as it is, is registered as
// default.train with its 2 ranks placed on its pods' nodes, and trains.
func (e *env) jobSetRegistered(t *testing.T) {
	e.registerExample(t, "deploy/examples/jobset-train.yaml", "JobSet", 2)
}

// setPods returns the pods of JobSet name that are not being deleted.
func (e *env) setPods(ns, name string) []corev1.Pod {
	pods, err := e.cp.Kube.CoreV1().Pods(ns).List(e.ctx, metav1.ListOptions{LabelSelector: "jobset.sigs.k8s.io/jobset-name=" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
}

// jobSetPods returns the live pods of JobSet name (not being deleted) by
// job index.
func (e *env) jobSetPods(ns, name string) map[string]corev1.Pod {
	out := map[string]corev1.Pod{}
	for _, p := range e.setPods(ns, name) {
		out[p.Labels["jobset.sigs.k8s.io/job-index"]] = p
	}
	return out
}

// jobSetNodeLost: the node of the pod of job index 1 dies. Past the grace
// the controller declares it down and taints it, the coordinator restores
// the newest consistent step, the driver deletes the set's child Jobs and
// pods, the JobSet controller recreates them, the pods land off the dead
// node and every rank resumes the restored step bit-identically.
func (e *env) jobSetNodeLost(t *testing.T) {
	e.loseNode(t, "JobSet", 2, func() map[string]corev1.Pod { return e.jobSetPods("default", "train") }, "1")
	js, err := e.cp.Dyn.Resource(kube.JobSets).Namespace("default").Get(e.ctx, "train", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	restarts, _, _ := unstructured.NestedInt64(js.Object, "status", "restarts")
	t.Logf("API server: JobSet status.restarts %d, events %q", restarts, e.eventsOf("default", "JobSet", "train"))
}
