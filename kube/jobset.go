package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// JobSets is the JobSet resource (sigs.k8s.io/jobset), read as
// unstructured objects (JobSet's Go module is not a dependency). The
// controller watches it when the API server serves it.
var JobSets = schema.GroupVersionResource{Group: "jobset.x-k8s.io", Version: "v1alpha2", Resource: "jobsets"}

// Labels the JobSet controller (pkg/controllers/jobset_controller.go,
// labelAndAnnotateObject) puts on its child Jobs and their pods, and the
// Job controller's completion index of a pod of an Indexed Job.
const (
	labelJobSetName        = "jobset.sigs.k8s.io/jobset-name"
	labelReplicatedJobName = "jobset.sigs.k8s.io/replicatedjob-name"
	labelJobSetJobIndex    = "jobset.sigs.k8s.io/job-index"
	labelRestartAttempt    = "jobset.sigs.k8s.io/restart-attempt"
	labelCompletionIndex   = "batch.kubernetes.io/job-completion-index" // a label since Kubernetes 1.28, an annotation before
	// jobSetController is spec.managedBy's value for the JobSet controller.
	jobSetController = "jobset.sigs.k8s.io/jobset-controller"
	// Kubeflow Trainer v2 labels each replicatedJob template of the JobSet
	// it builds for a TrainJob with the step it runs: "trainer" for the
	// training nodes, dataset-initializer, model-initializer before them.
	labelTrainerStep = "trainer.kubeflow.org/trainjob-ancestor-step"
	trainerStep      = "trainer"
	// envNprocPerNode is torchrun's --nproc-per-node as a variable (the
	// Trainer's torch plugin sets it from the TrainJob's numProcPerNode).
	envNprocPerNode = "PET_NPROC_PER_NODE"
)

// AnnProcsPerPod is the number of ranks in each pod of a JobSet (torchrun's
// --nproc-per-node); when absent, PET_NPROC_PER_NODE's value in its pods,
// else 1.
const AnnProcsPerPod = "rewind.dev/procs-per-pod"

// maxProcsPerPod bounds rewind.dev/procs-per-pod: more processes than
// this in one pod is a typo.
const maxProcsPerPod = 1024

// jobSets is the JobSet workload.
var jobSets workload = jobSetKind{}

type jobSetKind struct{}

func (jobSetKind) Kind() string { return "JobSet" }

// elastic: a JobSet's replicated jobs are not resized by rewind yet.
func (jobSetKind) elastic(shape, uint32) error {
	return errors.New("elastic recovery is not supported for JobSets yet (MPIJobs only): a JobSet's replicated jobs are not resized")
}

func (jobSetKind) resize(shape, uint32) (map[string]any, error) {
	return nil, errors.New("a JobSet is not resized by rewind")
}
func (jobSetKind) Resource() schema.GroupVersionResource { return JobSets }
func (jobSetKind) podLabel() string                      { return labelJobSetName }
func (jobSetKind) recreator() string                     { return "the JobSet controller" }
func (jobSetKind) gang() string                          { return "child Jobs, pods" }

// replicatedJob is one entry of spec.replicatedJobs; offset is the global
// index of its first pod.
type replicatedJob struct {
	name                  string
	replicas, parallelism int64
	offset                int64
}

// jobSetShape decides a JobSet's ranks: every pod runs procs ranks, pods
// are numbered across the replicatedJobs in spec order (a replicatedJob
// of r replicas × p parallelism takes r×p consecutive indexes, its Job i's
// pod of completion index k the index offset + i×p + k), and rank =
// pod index × procs + local rank. Only the pods of the current restart
// attempt (status.restarts) count.
type jobSetShape struct {
	rjobs    []replicatedJob
	procs    int64
	restarts int64
}

func (s jobSetShape) pods() int64 {
	var n int64
	for _, r := range s.rjobs {
		n += r.replicas * r.parallelism
	}
	return n
}

func (s jobSetShape) worldSize() int64 { return s.pods() * s.procs }

func (s jobSetShape) String() string {
	return fmt.Sprintf("%d pods × %d processes", s.pods(), s.procs)
}

// podIndex is p's global pod index, false when p is not one of the
// current attempt's pods.
func (s jobSetShape) podIndex(p *corev1.Pod) (int64, bool) {
	if a, err := strconv.ParseInt(p.Labels[labelRestartAttempt], 10, 64); err != nil || a != s.restarts {
		return 0, false
	}
	for _, r := range s.rjobs {
		if p.Labels[labelReplicatedJobName] != r.name {
			continue
		}
		i, err := strconv.ParseInt(p.Labels[labelJobSetJobIndex], 10, 64)
		if err != nil || i < 0 || i >= r.replicas {
			return 0, false
		}
		ci, ok := p.Labels[labelCompletionIndex]
		if !ok {
			ci, ok = p.Annotations[labelCompletionIndex]
		}
		var k int64
		if ok {
			if k, err = strconv.ParseInt(ci, 10, 64); err != nil || k < 0 || k >= r.parallelism {
				return 0, false
			}
		} else if r.parallelism > 1 {
			return 0, false
		}
		return r.offset + i*r.parallelism + k, true
	}
	return 0, false
}

func (s jobSetShape) placement(pods []*corev1.Pod) (map[uint32]string, bool) {
	placement := map[uint32]string{}
	for _, p := range pods {
		if p.Spec.NodeName == "" || p.DeletionTimestamp != nil ||
			p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			continue
		}
		i, ok := s.podIndex(p)
		if !ok {
			continue
		}
		for l := range s.procs {
			placement[uint32(i*s.procs+l)] = p.Spec.NodeName
		}
	}
	return placement, int64(len(placement)) == s.worldSize()
}

// shapeOf reads spec.replicatedJobs (replicas, default 1; the Job
// template's parallelism, default 1, which must equal its completions and
// be Indexed when above 1: every index runs at once), status.restarts and
// the ranks per pod (ranksPerPod).
//
// When replicatedJob templates carry Kubeflow Trainer's step label, only
// those of the trainer step run ranks (the initializers before them run
// none): a TrainJob's JobSet is numbered as torchrun's node ranks are.
func (jobSetKind) shapeOf(u *unstructured.Unstructured) (shape, error) {
	what := fmt.Sprintf("kube: JobSet %s/%s", u.GetNamespace(), u.GetName())
	rjobs, _, err := unstructured.NestedSlice(u.Object, "spec", "replicatedJobs")
	if err != nil || len(rjobs) == 0 {
		return nil, fmt.Errorf("%s: spec.replicatedJobs missing or empty", what)
	}
	trainer := false
	for _, o := range rjobs {
		m, _ := o.(map[string]any)
		if _, ok, _ := unstructured.NestedString(m, "template", "metadata", "labels", labelTrainerStep); ok {
			trainer = true
		}
	}
	s := jobSetShape{}
	var offset int64
	var ranked []map[string]any
	for i, o := range rjobs {
		m, _ := o.(map[string]any)
		name, _, _ := unstructured.NestedString(m, "name")
		if step, _, _ := unstructured.NestedString(m, "template", "metadata", "labels", labelTrainerStep); trainer && step != trainerStep {
			continue
		}
		replicas, found, err := unstructured.NestedInt64(m, "replicas")
		if !found && err == nil {
			replicas = 1
		}
		if err != nil || replicas < 0 || name == "" {
			return nil, fmt.Errorf("%s: spec.replicatedJobs[%d]: a name and replicas of 0 or more needed", what, i)
		}
		par, found, err := unstructured.NestedInt64(m, "template", "spec", "parallelism")
		if !found && err == nil {
			par = 1
		}
		if err != nil || par < 1 {
			return nil, fmt.Errorf("%s: spec.replicatedJobs[%d] (%s): parallelism below 1", what, i, name)
		}
		if c, found, _ := unstructured.NestedInt64(m, "template", "spec", "completions"); found && c != par {
			return nil, fmt.Errorf("%s: spec.replicatedJobs[%d] (%s): completions %d differ from parallelism %d: ranks need every pod at once", what, i, name, c, par)
		}
		if mode, _, _ := unstructured.NestedString(m, "template", "spec", "completionMode"); par > 1 && mode != string(batchv1.IndexedCompletion) {
			return nil, fmt.Errorf("%s: spec.replicatedJobs[%d] (%s): parallelism %d needs completionMode Indexed (a pod's completion index is part of its rank)", what, i, name, par)
		}
		s.rjobs = append(s.rjobs, replicatedJob{name: name, replicas: replicas, parallelism: par, offset: offset})
		offset += replicas * par
		ranked = append(ranked, m)
	}
	if s.pods() < 1 {
		return nil, fmt.Errorf("%s: spec.replicatedJobs run no pod", what)
	}
	if s.procs, err = ranksPerPod(u, ranked); err != nil {
		return nil, err
	}
	s.restarts, _, _ = unstructured.NestedInt64(u.Object, "status", "restarts")
	return s, nil
}

// ranksPerPod is rewind.dev/procs-per-pod, else the number in
// PET_NPROC_PER_NODE of the ranked replicatedJobs' first containers (all
// the same), else 1. A PET_NPROC_PER_NODE that is not a number (torchrun's
// "auto", "gpu") needs the annotation: rewind cannot count the devices.
func ranksPerPod(u *unstructured.Unstructured, rjobs []map[string]any) (int64, error) {
	if v, ok := u.GetAnnotations()[AnnProcsPerPod]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 1 || n > maxProcsPerPod {
			return 0, &annotationError{Key: AnnProcsPerPod, Value: v, Problem: fmt.Sprintf("want a number of processes from 1 to %d", maxProcsPerPod)}
		}
		return n, nil
	}
	procs := ""
	for _, m := range rjobs {
		ctrs, _, _ := unstructured.NestedSlice(m, "template", "spec", "template", "spec", "containers")
		if len(ctrs) == 0 {
			continue
		}
		c, _ := ctrs[0].(map[string]any)
		env, _, _ := unstructured.NestedSlice(c, "env")
		for _, e := range env {
			em, _ := e.(map[string]any)
			if em["name"] != envNprocPerNode {
				continue
			}
			v, _ := em["value"].(string)
			if procs != "" && v != procs {
				return 0, fmt.Errorf("kube: JobSet %s/%s: %s differs between replicatedJobs (%q, %q): set %s", u.GetNamespace(), u.GetName(), envNprocPerNode, procs, v, AnnProcsPerPod)
			}
			procs = v
		}
	}
	if procs == "" {
		return 1, nil
	}
	n, err := strconv.ParseInt(procs, 10, 64)
	if err != nil || n < 1 || n > maxProcsPerPod {
		return 0, fmt.Errorf("kube: JobSet %s/%s: %s=%q is not a number of processes: set %s to the ranks per pod", u.GetNamespace(), u.GetName(), envNprocPerNode, procs, AnnProcsPerPod)
	}
	return n, nil
}

// finished says why the JobSet controller will never again create the
// JobSet's Jobs: a Completed or Failed condition is True (jobSetFinished;
// it then deletes the active Jobs and stops).
func (jobSetKind) finished(u *unstructured.Unstructured) string {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		typ, _ := m["type"].(string)
		st, _ := m["status"].(string)
		if (typ == "Completed" || typ == "Failed") && st == string(corev1.ConditionTrue) {
			reason, _ := m["reason"].(string)
			return fmt.Sprintf("%s (%s)", typ, reason)
		}
	}
	return ""
}

// managedElsewhere returns spec.managedBy when it is not the JobSet
// controller (MultiKueue), or "".
func (jobSetKind) managedElsewhere(u *unstructured.Unstructured) string {
	m, _, _ := unstructured.NestedString(u.Object, "spec", "managedBy")
	if m == jobSetController {
		return ""
	}
	return m
}

// deleteGang deletes the JobSet's child Jobs created before before
// (background propagation: the Job is gone at once, so the JobSet
// controller recreates it under the same name without waiting for pods
// that a dead kubelet will never finish), then those Jobs' pods (a pod on
// a dead node with no grace period). Jobs first: a pod deleted under a
// live Job would be replaced by the Job controller in the old gang. Only
// the replicatedJobs that run ranks are restarted: a TrainJob's
// initializers, done before training started, are not run again.
func (jobSetKind) deleteGang(ctx context.Context, d *MPIJobDriver, u *unstructured.Unstructured, before time.Time, deadNode string) (int, error) {
	ns, name := u.GetNamespace(), u.GetName()
	rjobs := rankedNames(u)
	sel := labels.SelectorFromSet(labels.Set{labelJobSetName: name}).String()
	jobs, err := d.Kube.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, j := range jobs.Items {
		owner := metav1.GetControllerOf(&j)
		if owner == nil || owner.Kind != "JobSet" || owner.Name != name || !slices.Contains(rjobs, j.Labels[labelReplicatedJobName]) ||
			!j.CreationTimestamp.Time.Before(before) || j.DeletionTimestamp != nil {
			continue
		}
		bg := metav1.DeletePropagationBackground
		err := d.Kube.BatchV1().Jobs(ns).Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: &bg, Preconditions: &metav1.Preconditions{UID: &j.UID}})
		if err != nil && !isNotFound(err) {
			return n, err
		}
		n++
	}
	for _, r := range rjobs {
		m, err := d.deletePods(ctx, ns, labels.Set{labelJobSetName: name, labelReplicatedJobName: r}, before, deadNode, map[string]bool{})
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// rankedNames are the replicatedJobs of u whose pods run ranks (all of
// them when the spec does not parse).
func rankedNames(u *unstructured.Unstructured) []string {
	var names []string
	if sh, err := jobSets.shapeOf(u); err == nil {
		for _, r := range sh.(jobSetShape).rjobs {
			names = append(names, r.name)
		}
		return names
	}
	rjobs, _, _ := unstructured.NestedSlice(u.Object, "spec", "replicatedJobs")
	for _, o := range rjobs {
		m, _ := o.(map[string]any)
		if name, _, _ := unstructured.NestedString(m, "name"); name != "" {
			names = append(names, name)
		}
	}
	return names
}
