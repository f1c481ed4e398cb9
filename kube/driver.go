package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/regang"
)

// MPIJobDriver restarts an MPIJob's gang after a recovery: it records the
// step to restore on the MPIJob (rewind.dev/restoring-step) and which
// recovery did it (rewind.dev/regang-id, rewind.dev/regang-at), then
// deletes the old gang: the worker pods, the launcher's batch/v1 Job
// (NAME-launcher) and its pods. mpi-operator (pkg/controller/
// mpi_job_controller.go, syncHandler) recreates every missing worker pod
// NAME-worker-i and a missing launcher Job while the MPIJob is not
// finished (a Succeeded or Failed condition with status.completionTime
// set) and not suspended: the workers, placed by the scheduler away from
// the tainted node, and a new launcher Job (fresh backoffLimit) whose
// mpirun starts every rank afresh; each rank's SDK resumes from the step
// the coordinator restored.
//
// A pod on a dead node (the recovery's, one gone from the cluster, one
// tainted by rewind or not Ready) is deleted with a grace period of 0:
// its kubelet will never confirm a graceful deletion, the pod would stay
// Terminating, and mpi-operator, finding a pod of that name, would never
// create the worker again.
//
// Workers go first, then the launcher Job: a launcher Job deleted while
// the old workers are still there (Ready) would be recreated at once by
// mpi-operator even with launcherCreationPolicy WaitForWorkersReady, and
// its mpirun would start on the workers about to be deleted. The old
// launcher's failures meanwhile do not matter: its Job is deleted.
//
// Why not let the pods' restart policies do it: mpi-operator never
// replaces a worker pod that exists (a Failed one included: workers
// default to restartPolicy Never), with restartPolicy ExitCode (or Never)
// a launcher that failed because a worker vanished is never started again
// once the workers are back (kubeflow/trainer#1768), and a worker
// restarted in place cannot rejoin a running mpirun.
//
// Regang may be called concurrently for different jobs.
type MPIJobDriver struct {
	Kube     kubernetes.Interface
	Dyn      dynamic.Interface
	Recorder record.EventRecorder
	Log      *slog.Logger
	// Clock stamps rewind.dev/regang-at; nil is the real clock.
	Clock clock.PassiveClock
}

// For returns the driver of MPIJob name in namespace ns: what the
// controller follows the job's recoveries with. (A job id is not turned
// back into an MPIJob: a long name's id is shortened, see
// shm.KubeJobID.)
func (d *MPIJobDriver) For(ns, name string) regang.Driver {
	return jobRegang{d: d, w: mpiJobs, ns: ns, name: name}
}

// ForJobSet returns the driver of JobSet name in namespace ns. It
// restarts the set as For does an MPIJob, deleting the current child Jobs
// and their pods for the JobSet controller to recreate (see
// jobSetKind.deleteGang).
func (d *MPIJobDriver) ForJobSet(ns, name string) regang.Driver {
	return jobRegang{d: d, w: jobSets, ns: ns, name: name}
}

func (d *MPIJobDriver) forKind(w workload, ns, name string) regang.Driver {
	return jobRegang{d: d, w: w, ns: ns, name: name}
}

type jobRegang struct {
	d        *MPIJobDriver
	w        workload
	ns, name string
}

var _ regang.Driver = jobRegang{}

func (r jobRegang) Regang(ctx context.Context, ev *coordpb.JobEvent) error {
	return r.d.regang(ctx, r.w, r.ns, r.name, ev)
}

// Regang restarts MPIJob ns/name to restore the event's step, once per
// recovery: an event seen again (a reopened watch, a new leader) finds its
// id on the MPIJob and only finishes deleting the old gang, if an earlier
// try was cut short. An event of another job than the MPIJob's is refused.
func (d *MPIJobDriver) Regang(ctx context.Context, ns, name string, ev *coordpb.JobEvent) error {
	return d.regang(ctx, mpiJobs, ns, name, ev)
}

func (d *MPIJobDriver) regang(ctx context.Context, w workload, ns, name string, ev *coordpb.JobEvent) error {
	if id, err := coordJob(ns, name); err != nil || id != ev.Job {
		return fmt.Errorf("kube: a recovery of job %q is not one of %s %s/%s (job %q)", ev.Job, w.Kind(), ns, name, id)
	}
	u, err := d.Dyn.Resource(w.Resource()).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kube: regang of %s %s/%s: %w", w.Kind(), ns, name, err)
	}
	d.taintDead(ctx, ev.Node)
	if u, err = d.resize(ctx, w, u, ev); err != nil {
		return err
	}
	id := "recovery-" + strconv.FormatInt(ev.DetectedUnixNano, 10)
	why := "recovery"
	switch {
	case ev.Node == "" && ev.Reason != "": // an operator's restore
		why = ev.Reason
	case ev.Reason != "":
		why += ": " + ev.Reason
	}
	return d.restart(ctx, w, u, ev.Step, id, why, ev.Node, ev.PreviousWorldSize != 0)
}

// restart records step on the MPIJob and restarts its gang (deadNode,
// when set, is the node whose death started it), unless mpi-operator
// would not recreate the gang or the MPIJob already carries regang id.
// resharding says the new gang is of another world size than the step
// (an elastic recovery): its ranks reshard the step from wherever its
// shards are, the agents fetching what their node lacks, so there is no
// shard per rank to place on its pod's node (placeShards).
func (d *MPIJobDriver) restart(ctx context.Context, w workload, u *unstructured.Unstructured, step int64, id, why, deadNode string, resharding bool) error {
	key := jobKey(u.GetNamespace(), u.GetName())
	if u.GetAnnotations()[AnnRegangID] == id {
		if w.finished(u) != "" || w.managedElsewhere(u) != "" {
			return nil // nothing of the old gang to finish deleting
		}
		// Restarted already, perhaps not completely (an API error, a
		// leader lost half-way): delete what is left of the old gang,
		// never what mpi-operator created since.
		at, err := time.Parse(time.RFC3339, u.GetAnnotations()[AnnRegangAt])
		if err != nil {
			d.Log.Info("kube: gang already restarted for this", "job", key, "regang_id", id)
			return nil
		}
		deleted, err := w.deleteGang(ctx, d, u, at, deadNode)
		if err != nil {
			return fmt.Errorf("kube: restarting the gang of %s: %w", key, err)
		}
		d.Log.Info("kube: gang already restarted for this", "job", key, "regang_id", id, "deleted_now", deleted)
		if deleted > 0 {
			d.Recorder.Eventf(u, corev1.EventTypeNormal, ReasonRegang,
				"restarting the gang to restore step %d (%s), finished: %d objects of the old gang left, deleted for %s to recreate", step, why, deleted, w.recreator())
		}
		return nil
	}
	if m := w.managedElsewhere(u); m != "" {
		field := "spec.runPolicy.managedBy"
		if w == jobSets {
			field = "spec.managedBy"
		}
		return d.cannotRestart(u, step, fmt.Sprintf("its %s is %s: %s here does not run its pods", field, m, w.recreator()))
	}
	if f := w.finished(u); f != "" {
		return d.cannotRestart(u, step, fmt.Sprintf("%s marked it %s and never recreates the pods of a finished %s; resubmit it (its checkpoints are kept) to resume from step %d", w.recreator(), f, w.Kind(), step))
	}
	now := time.Now()
	if d.Clock != nil {
		now = d.Clock.Now()
	}
	// Seconds, as pods' creationTimestamps: a pod created in the second of
	// the restart or later is the new gang's (sinceRegang, deleteGang).
	at := now.UTC().Truncate(time.Second)
	ann := map[string]any{
		AnnRestoringStep: strconv.FormatInt(step, 10),
		AnnRegangID:      id,
		AnnRegangAt:      at.Format(time.RFC3339),
	}
	if resharding {
		ann[AnnPlacedID] = id
	}
	if err := d.annotate(ctx, u, ann); err != nil {
		return err
	}
	deleted, err := w.deleteGang(ctx, d, u, at, deadNode)
	if err != nil {
		return fmt.Errorf("kube: restarting the gang of %s: %w", key, err)
	}
	d.Log.Info("kube: gang restarted", "job", key, "kind", w.Kind(), "step", step, "why", why, "deleted", deleted)
	d.Recorder.Eventf(u, corev1.EventTypeNormal, ReasonRegang,
		"restarting the gang to restore step %d (%s): %d objects of the old gang (%s) deleted for %s to recreate", step, why, deleted, w.gang(), w.recreator())
	return nil
}

// cannotRestart reports on the MPIJob that its gang cannot be restarted
// and leaves it as it is: retrying would not help.
func (d *MPIJobDriver) cannotRestart(u *unstructured.Unstructured, step int64, why string) error {
	d.Log.Warn("kube: cannot restart the gang", "job", jobKey(u.GetNamespace(), u.GetName()), "step", step, "why", why)
	d.Recorder.Eventf(u, corev1.EventTypeWarning, ReasonRegangImpossible, "cannot restart the gang to restore step %d: %s", step, why)
	return nil
}

// annotate merge-patches the MPIJob's annotations (nil removes one), on
// the condition that it did not change since u was read.
func (d *MPIJobDriver) annotate(ctx context.Context, u *unstructured.Unstructured, ann map[string]any) error {
	return d.patchAnnotations(ctx, u, ann, u.GetResourceVersion(), "annotating")
}

// setResult records an operator restore's result on the MPIJob, whatever
// changed since it was read (the re-gang annotates it too).
func (d *MPIJobDriver) setResult(ctx context.Context, u *unstructured.Unstructured, result string) error {
	return d.patchAnnotations(ctx, u, map[string]any{AnnRestoreResult: result}, "", "recording the restore result on")
}

// patchAnnotations merge-patches the MPIJob's annotations, on the
// condition that its resourceVersion is still rv when rv is set.
func (d *MPIJobDriver) patchAnnotations(ctx context.Context, u *unstructured.Unstructured, ann map[string]any, rv, doing string) error {
	meta := map[string]any{"annotations": ann}
	if rv != "" {
		meta["resourceVersion"] = rv
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return err
	}
	w := workloadOf(u)
	_, err = d.Dyn.Resource(w.Resource()).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("kube: %s %s %s/%s: %w", doing, w.Kind(), u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// deleteGang deletes what of MPIJob name's gang was created before
// before: its worker pods, then the launcher Job, then the launcher's
// pods, and returns how many objects it deleted. A pod on a dead node is
// deleted at once (grace period 0); see MPIJobDriver.
func (d *MPIJobDriver) deleteGang(ctx context.Context, ns, name string, before time.Time, deadNode string) (int, error) {
	dead := map[string]bool{}
	n, err := d.deletePods(ctx, ns, labels.Set{labelJobName: name, labelJobRole: roleWorker}, before, deadNode, dead)
	if err != nil {
		return n, err
	}
	j, err := d.Kube.BatchV1().Jobs(ns).Get(ctx, name+launcherSuffix, metav1.GetOptions{})
	switch {
	case isNotFound(err):
	case err != nil:
		return n, err
	case j.CreationTimestamp.Time.Before(before):
		bg := metav1.DeletePropagationBackground
		err := d.Kube.BatchV1().Jobs(ns).Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: &bg, Preconditions: &metav1.Preconditions{UID: &j.UID}})
		if err != nil && !isNotFound(err) {
			return n, err
		}
		n++
	}
	m, err := d.deletePods(ctx, ns, labels.Set{labelJobName: name, labelJobRole: roleLauncher}, before, deadNode, dead)
	return n + m, err
}

// deletePods deletes the pods of set created before before (a new gang's
// are left alone), a pod on a dead node with no grace period, and returns
// how many it deleted; dead caches nodeDead's answers.
func (d *MPIJobDriver) deletePods(ctx context.Context, ns string, set labels.Set, before time.Time, deadNode string, dead map[string]bool) (int, error) {
	pods, err := d.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(set).String()})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pods.Items {
		if !p.CreationTimestamp.Time.Before(before) {
			continue // the new gang
		}
		opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}}
		if d.nodeDead(ctx, p.Spec.NodeName, deadNode, dead) {
			opts.GracePeriodSeconds = new(int64)
		} else if p.DeletionTimestamp != nil {
			continue // on its way out already
		}
		if err := d.Kube.CoreV1().Pods(ns).Delete(ctx, p.Name, opts); err != nil && !isNotFound(err) {
			return n, err
		}
		n++
	}
	return n, nil
}

// nodeDead reports whether node is dead: the recovery's deadNode, gone
// from the cluster, tainted by rewind or not Ready. known caches the
// answers of one deleteGang.
func (d *MPIJobDriver) nodeDead(ctx context.Context, node, deadNode string, known map[string]bool) bool {
	if node == "" {
		return false // not scheduled: a graceful deletion is immediate
	}
	if node == deadNode {
		return true
	}
	if v, ok := known[node]; ok {
		return v
	}
	n, err := d.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	dead := isNotFound(err)
	if err == nil {
		c := readyCondition(n)
		dead = hasTaint(n, TaintUnhealthy) || (c != nil && c.Status != corev1.ConditionTrue)
	}
	known[node] = dead
	return dead
}

// taintDead taints the node whose death started a recovery (failure
// detection saw it before, or without, its Ready condition going False),
// so the scheduler does not place the new gang there; a node that is gone
// or tainted already is left alone.
func (d *MPIJobDriver) taintDead(ctx context.Context, node string) {
	if node == "" {
		return
	}
	n, err := d.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil || hasTaint(n, TaintUnhealthy) {
		return
	}
	now := time.Now()
	if d.Clock != nil {
		now = d.Clock.Now()
	}
	if err := taintNode(ctx, d.Kube, n, now); err != nil {
		d.Log.Warn("kube: tainting the dead node", "node", node, "err", err)
		return
	}
	d.Recorder.Eventf(n, corev1.EventTypeWarning, ReasonNodeDown, "tainted %s: declared dead by rewind's failure detection", TaintUnhealthy)
}

// resize changes the job's spec to the event's world size when an
// elastic recovery changed it (MPIJob: its workers), before the gang is
// restarted, so that the kind's controller recreates the smaller gang;
// it returns the job as it is now. A job already of that size (the event
// seen again) is left as it is.
func (d *MPIJobDriver) resize(ctx context.Context, w workload, u *unstructured.Unstructured, ev *coordpb.JobEvent) (*unstructured.Unstructured, error) {
	if ev.PreviousWorldSize == 0 || ev.WorldSize == 0 {
		return u, nil
	}
	shape, err := w.shapeOf(u)
	if err != nil {
		return nil, fmt.Errorf("kube: resizing %s %s/%s: %w", w.Kind(), u.GetNamespace(), u.GetName(), err)
	}
	if shape.worldSize() == int64(ev.WorldSize) {
		return u, nil
	}
	patch, err := w.resize(shape, ev.WorldSize)
	if err == nil {
		var data []byte
		if data, err = json.Marshal(patch); err == nil {
			u, err = d.Dyn.Resource(w.Resource()).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.MergePatchType, data, metav1.PatchOptions{})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kube: resizing %s %s/%s to world size %d for its elastic recovery: %w", w.Kind(), u.GetNamespace(), u.GetName(), ev.WorldSize, err)
	}
	d.Log.Info("kube: job resized by an elastic recovery", "job", jobKey(u.GetNamespace(), u.GetName()), "world_size", ev.WorldSize, "was", shape.worldSize())
	d.Recorder.Eventf(u, corev1.EventTypeNormal, ReasonResized, "elastic recovery: %d ranks, was %d (%s); %s", ev.WorldSize, shape.worldSize(), shape, ev.Reason)
	return u, nil
}
