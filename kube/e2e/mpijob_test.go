package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/kube"
)

// TestMPIJob runs the project's own example MPIJob
// (deploy/examples/mpijob-train.yaml, 2 workers × 2 slots) on three
// nodes under the real mpi-operator, with rewind's controller running as
// the chart's ServiceAccount, and goes through what a user sees: a bad
// annotation refused, the job registered, a node lost and the job
// restored on the spare bit-identically, an operator restore by
// annotation, and the job finishing with its checkpoints kept.
func TestMPIJob(t *testing.T) {
	e := setup(t)
	e.useCoordinator(e.runCoordinator("coordinator-0", nil).addr)
	for i := range 3 {
		e.addNode(fmt.Sprintf("node-%d", i))
	}

	for _, phase := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"bad annotation", e.badAnnotation},
		{"registered", e.registered},
		// Step 10 is on the nodes' NVMe (the example's policy): going
		// back to it deletes the later steps and restarts the gang.
		{"operator restore", e.operatorRestore},
		{"node lost", func(t *testing.T) { e.nodeLost(t) }},
		{"finished, checkpoints kept", e.finished},
	} {
		ok := t.Run(phase.name, phase.run)
		e.t = t
		if !ok {
			t.FailNow() // each phase starts where the one before ended
		}
	}
	if f := e.forbidden(); len(f) > 0 {
		t.Errorf("the API server refused the controller (the chart's RBAC is short):\n%s", strings.Join(f, "\n"))
	}
}

// badAnnotation: a value that does not parse gets one Warning
// InvalidAnnotation naming it, and nothing else: no registration, no
// annotation written. (Suspended, so mpi-operator starts no pods.)
func (e *env) badAnnotation(t *testing.T) {
	e.t = t
	e.applyFile("deploy/examples/mpijob-train.yaml", func(u *unstructured.Unstructured) {
		u.SetName("bad")
		ann := u.GetAnnotations()
		ann[kube.AnnReplicas] = "lots"
		u.SetAnnotations(ann)
		_ = unstructured.SetNestedField(u.Object, true, "spec", "runPolicy", "suspend")
	})
	ev := e.waitEvent("default", "MPIJob", "bad", kube.ReasonInvalidAnnotation, 30*time.Second)
	if !strings.Contains(ev, kube.AnnReplicas) || !strings.Contains(ev, "lots") {
		t.Fatalf("event %q does not name the annotation and its value", ev)
	}
	t.Logf("API server: %s", ev)
	jobs, err := e.api.ListJobs(e.ctx, &coordpb.ListJobsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs.Jobs {
		if j.Id == "default.bad" {
			t.Fatalf("job default.bad registered despite its bad annotation: %v", j)
		}
	}
	for k := range e.mpiJob("default", "bad").GetAnnotations() {
		if strings.HasPrefix(k, "rewind.dev/") && k != kube.AnnCheckpoint && k != kube.AnnReplicas && k != kube.AnnPolicy {
			t.Fatalf("the controller wrote %s on an MPIJob it refused", k)
		}
	}
	if evs := e.eventsFrom("default", "MPIJob", "bad", "rewind-coordinator"); len(evs) != 1 {
		t.Fatalf("rewind's events %q, want the one InvalidAnnotation", evs)
	}
}

// registered: the example, applied as it is, is registered as
// default.train with its 4 ranks placed on the workers' nodes, and its
// ranks (started by mpirun in the launcher mpi-operator created) train.
func (e *env) registered(t *testing.T) {
	e.registerExample(t, "deploy/examples/mpijob-train.yaml", "MPIJob", 4)
}

// registerExample applies an example manifest as it is and checks that
// its job (kind, named train) is registered as default.train with world
// ranks, all placed, and trains past step 12.
func (e *env) registerExample(t *testing.T, manifest, kind string, world int) {
	e.t = t
	e.applyFile(manifest, nil)
	ev := e.waitEvent("default", kind, "train", kube.ReasonRegistered, 60*time.Second)
	if ranks := fmt.Sprintf("%d ranks", world); !strings.Contains(ev, "default.train") || !strings.Contains(ev, ranks) {
		t.Fatalf("event %q, want the job id default.train and %s", ev, ranks)
	}
	t.Logf("API server: %s", ev)
	e.eventually(60*time.Second, "default.train to be placed on every rank's node and train past step 12", func() error {
		jobs, err := e.api.ListJobs(e.ctx, &coordpb.ListJobsRequest{})
		if err != nil {
			return err
		}
		for _, j := range jobs.Jobs {
			if j.Id == "default.train" {
				if j.WorldSize != uint32(world) || len(j.Placement) != world {
					return fmt.Errorf("job %v: want %d ranks, all placed", j, world)
				}
				if j.LatestConsistent < 12 {
					return fmt.Errorf("latest consistent step %d", j.LatestConsistent)
				}
				return nil
			}
		}
		return fmt.Errorf("default.train not registered (jobs %v)", jobs.Jobs)
	})
}

// nodeLost: the node of worker 1 dies (its agent and ranks killed, its
// lease no longer renewed). kube-controller-manager marks it NotReady;
// past the grace the controller declares it down (Event NodeDown), taints
// it, the coordinator restores the newest consistent step and the driver
// restarts the gang; mpi-operator recreates the workers and the
// launcher, the workers land on the spare, and every rank resumes the
// restored step bit-identically.
func (e *env) nodeLost(t *testing.T) {
	e.loseNode(t, "MPIJob", 4, func() map[string]corev1.Pod { return e.workers("default", "train") }, "train-worker-1")
}

// loseNode kills the node of pod victim of the job (kind, world ranks,
// its pods by a stable key), and checks what nodeLost and
// jobSetNodeLost say: NotReady, NodeDown and the taint, a Regang naming
// the node, every rank resumed bit-identically at no older step, every
// pod recreated off the node.
func (e *env) loseNode(t *testing.T, kind string, world int, pods func() map[string]corev1.Pod, victim string) {
	e.t = t
	old := pods()
	dead := old[victim].Spec.NodeName
	if dead == "" {
		t.Fatalf("pod %s has no node: %v", victim, old)
	}
	from := e.latest("default.train")
	e.eventually(30*time.Second, "the restarted job to train on", func() error {
		if s := e.latest("default.train"); s < from+3 {
			return fmt.Errorf("latest consistent step %d", s)
		}
		return nil
	})
	// A step consistent at the kill whose replicas were not made yet is
	// lost with the node; the one memory keeps through any node's loss is
	// what the recovery must restore at least.
	before, kept := e.latest("default.train"), e.protected("default.train")
	since := e.rankCount()
	killed := time.Now()
	e.cluster.Kill(e.cluster.Node(dead))
	notReady := e.notReadyAndTainted(dead)
	t.Logf("API server: Node %s: %s", dead, e.waitEvent("", "Node", dead, kube.ReasonNodeDown, 30*time.Second))
	t.Logf("API server: %s: %s", kind, e.waitEvent("default", kind, "train", kube.ReasonRegang, 30*time.Second, "node "+dead+" down"))
	step := e.resumed("default.train", world, since, 120*time.Second)
	restored := time.Now()
	var on []string
	for name, p := range pods() {
		if p.UID == old[name].UID || p.Spec.NodeName == dead {
			t.Fatalf("pod %s was not recreated off %s: %s on %s", name, dead, p.UID, p.Spec.NodeName)
		}
		on = append(on, name+" on "+p.Spec.NodeName)
	}
	if step < kept {
		t.Fatalf("the ranks resumed step %d, older than %d, kept in two nodes' memory before the loss (%d consistent)", step, kept, before)
	}
	slices.Sort(on)
	t.Logf("node %s lost at consistent step %d: Ready=Unknown after %v; every rank resumed step %d bit-identically %v after NotReady (%v after the kill); now %s",
		dead, before, notReady.Sub(killed).Round(time.Millisecond), step, restored.Sub(notReady).Round(time.Millisecond),
		restored.Sub(killed).Round(time.Millisecond), strings.Join(on, ", "))
}

// notReadyAndTainted waits for node's Ready condition to leave True (the
// node lifecycle controller) and then for rewind's taint; it returns
// when the first was seen.
func (e *env) notReadyAndTainted(node string) time.Time {
	var notReady time.Time
	e.eventually(30*time.Second, "node "+node+" NotReady", func() error {
		n, err := e.cp.Kube.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
				notReady = time.Now()
				return nil
			}
		}
		return fmt.Errorf("still Ready")
	})
	e.eventually(60*time.Second, "the taint "+kube.TaintUnhealthy+" on "+node, func() error {
		n, err := e.cp.Kube.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == kube.TaintUnhealthy }) {
			return fmt.Errorf("taints %v", n.Spec.Taints)
		}
		return nil
	})
	return notReady
}

// operatorRestore: rewind.dev/restore-step on the MPIJob restores an
// older step and restarts the gang at it; the result is written back.
func (e *env) operatorRestore(t *testing.T) {
	e.restoreByAnnotation(t, kube.MPIJobs, "MPIJob", 4)
}

// restoreByAnnotation sets rewind.dev/restore-step on job default/train
// of resource res (kind) to the newest step older than the latest that
// is durable on the nodes' NVMe (the examples' policy), and checks that
// every one of its world ranks resumed that step bit-identically, and
// the result written back.
func (e *env) restoreByAnnotation(t *testing.T, res schema.GroupVersionResource, kind string, world int) {
	e.t = t
	since := e.rankCount()
	step := e.olderDurableStep("default.train", "nvme")
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{kube.AnnRestoreStep: strconv.FormatInt(step, 10)}}})
	if _, err := e.cp.Dyn.Resource(res).Namespace("default").Patch(e.ctx, "train", types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: "operator-alice"}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("restored step %d (asked by operator-alice)", step)
	e.eventually(60*time.Second, "the restore result on the "+kind, func() error {
		u, err := e.cp.Dyn.Resource(res).Namespace("default").Get(e.ctx, "train", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := u.GetAnnotations()[kube.AnnRestoreResult]; got != want {
			return fmt.Errorf("%s=%q, want %q", kube.AnnRestoreResult, got, want)
		}
		return nil
	})
	t.Logf("API server: %s", e.waitEvent("default", kind, "train", kube.ReasonRestored, 30*time.Second))
	if got := e.resumed("default.train", world, since, 120*time.Second); got != step {
		t.Fatalf("ranks resumed step %d, the operator asked for %d", got, step)
	}
	t.Logf("API server: restore-result %q; every rank resumed step %d bit-identically", want, step)
}

// olderDurableStep waits for a consistent step of job, older than its
// latest, with a durable copy on tier, and returns the newest such step:
// the one retention removes last, so that an operator asking for it
// finds it kept however long the request takes.
func (e *env) olderDurableStep(job, tier string) int64 {
	e.t.Helper()
	step := int64(-1)
	e.eventually(60*time.Second, "a step of "+job+" older than the latest and durable on "+tier, func() error {
		latest := e.latest(job)
		steps, err := e.api.ListSteps(e.ctx, &coordpb.ListStepsRequest{Job: job})
		if err != nil {
			return err
		}
		for _, s := range steps.Steps {
			if s.Step >= latest || s.State != coordpb.StepState_STEP_STATE_CONSISTENT || s.Step <= step {
				continue
			}
			if slices.ContainsFunc(s.Tiers, func(c *coordpb.TierCopy) bool {
				return c.Tier == tier && c.State == coordpb.TierCopyState_TIER_COPY_STATE_DURABLE
			}) {
				step = s.Step
			}
		}
		if step < 0 {
			return fmt.Errorf("none (latest %d, %d steps)", latest, len(steps.Steps))
		}
		return nil
	})
	return step
}

// finished: the ranks train to the last step, mpirun ends, the launcher
// Job completes and mpi-operator marks the MPIJob Succeeded; rewind keeps
// the job's checkpoints (its policy decides, not the job's end).
func (e *env) finished(t *testing.T) {
	e.t = t
	e.eventually(3*time.Minute, "mpi-operator to mark the MPIJob Succeeded", func() error {
		conds, _, _ := unstructured.NestedSlice(e.mpiJob("default", "train").Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Succeeded" && m["status"] == "True" {
				return nil
			}
		}
		return fmt.Errorf("conditions %v", conds)
	})
	if got := e.latest("default.train"); got != trainSteps {
		t.Fatalf("latest consistent step %d, want the last one, %d", got, trainSteps)
	}
	steps, err := e.api.ListSteps(e.ctx, &coordpb.ListStepsRequest{Job: "default.train"})
	if err != nil || len(steps.Steps) == 0 {
		t.Fatalf("steps of the finished job: %v, %v", steps, err)
	}
	t.Logf("finished: %d steps kept, the newest %d", len(steps.Steps), trainSteps)
}
