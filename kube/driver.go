package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
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
// recovery did it (rewind.dev/regang-id), then deletes the launcher's
// batch/v1 Job (NAME-launcher, its pods with it) and every pod of the job,
// launcher's first. mpi-operator recreates what is missing while the
// MPIJob is neither finished nor suspended: the workers, placed by the
// scheduler away from the tainted node, and a new launcher whose mpirun
// starts every rank afresh; each rank's SDK resumes from the step the
// coordinator restored.
//
// Why not let the pods' restart policies do it: with restartPolicy
// ExitCode (or Never) a launcher that failed because a worker vanished is
// never started again once the workers are back (kubeflow/trainer#1768),
// and a worker restarted in place cannot rejoin a running mpirun. The
// launcher goes first so that its mpirun, losing its workers, does not
// use up the launcher Job's backoffLimit and fail the MPIJob.
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

var _ regang.Driver = (*MPIJobDriver)(nil)

// Regang restarts the event's job (NAMESPACE/NAME) to restore its step,
// once per recovery: an event seen again (a reopened watch, a new leader)
// finds its id on the MPIJob and does nothing.
func (d *MPIJobDriver) Regang(ctx context.Context, ev *coordpb.JobEvent) error {
	ns, name, ok := strings.Cut(ev.Job, "/")
	if !ok {
		return fmt.Errorf("kube: job %q is not NAMESPACE/NAME: not an MPIJob", ev.Job)
	}
	u, err := d.Dyn.Resource(MPIJobs).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kube: regang of %s: %w", ev.Job, err)
	}
	d.taintDead(ctx, ev.Node)
	id := "recovery-" + strconv.FormatInt(ev.DetectedUnixNano, 10)
	why := "recovery"
	switch {
	case ev.Node == "" && ev.Reason != "": // an operator's restore
		why = ev.Reason
	case ev.Reason != "":
		why += ": " + ev.Reason
	}
	return d.restart(ctx, u, ev.Step, id, why, nil)
}

// restart records step (and ann) on the MPIJob and restarts its gang,
// unless the MPIJob already carries regang id.
func (d *MPIJobDriver) restart(ctx context.Context, u *unstructured.Unstructured, step int64, id, why string, ann map[string]any) error {
	key := jobID(u.GetNamespace(), u.GetName())
	if u.GetAnnotations()[AnnRegangID] == id {
		d.Log.Info("kube: gang already restarted for this", "job", key, "regang_id", id)
		return nil
	}
	if ann == nil {
		ann = map[string]any{}
	}
	ann[AnnRestoringStep] = strconv.FormatInt(step, 10)
	ann[AnnRegangID] = id
	now := time.Now()
	if d.Clock != nil {
		now = d.Clock.Now()
	}
	ann[AnnRegangAt] = now.UTC().Format(time.RFC3339)
	if err := d.annotate(ctx, u, ann); err != nil {
		return err
	}
	deleted, err := d.deleteGang(ctx, u.GetNamespace(), u.GetName())
	if err != nil {
		return fmt.Errorf("kube: restarting the gang of %s: %w", key, err)
	}
	d.Log.Info("kube: gang restarted", "job", key, "step", step, "why", why, "pods_deleted", deleted)
	d.Recorder.Eventf(u, corev1.EventTypeNormal, ReasonRegang,
		"restarting the gang to restore step %d (%s): launcher and %d pods deleted for mpi-operator to recreate", step, why, deleted)
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
	_, err = d.Dyn.Resource(MPIJobs).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("kube: %s MPIJob %s/%s: %w", doing, u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// deleteGang deletes the launcher Job and the job's pods, launcher's
// first, and returns how many pods it deleted.
func (d *MPIJobDriver) deleteGang(ctx context.Context, ns, name string) (int, error) {
	bg := metav1.DeletePropagationBackground
	err := d.Kube.BatchV1().Jobs(ns).Delete(ctx, name+launcherSuffix, metav1.DeleteOptions{PropagationPolicy: &bg})
	if err != nil && !isNotFound(err) {
		return 0, err
	}
	n := 0
	for _, role := range []string{roleLauncher, roleWorker} {
		sel := labels.SelectorFromSet(labels.Set{labelJobName: name, labelJobRole: role}).String()
		pods, err := d.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return n, err
		}
		for _, p := range pods.Items {
			if err := d.Kube.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !isNotFound(err) {
				return n, err
			}
			n++
		}
	}
	return n, nil
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
