package kube

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"rewind.dev/rewind/shm"
)

// MPIJobs is the resource the controller watches: mpi-operator's v2beta1
// MPIJob, read as unstructured objects (the operator's Go module is not a
// dependency).
var MPIJobs = schema.GroupVersionResource{Group: "kubeflow.org", Version: "v2beta1", Resource: "mpijobs"}

// Labels mpi-operator (v2) puts on the pods of an MPIJob.
const (
	labelJobName      = "training.kubeflow.org/job-name"
	labelJobRole      = "training.kubeflow.org/job-role" // "launcher" or "worker"
	labelReplicaIndex = "training.kubeflow.org/replica-index"
	roleWorker        = "worker"
	roleLauncher      = "launcher"
	launcherSuffix    = "-launcher" // the launcher's batch/v1 Job is NAME-launcher
)

// jobKey is an MPIJob's key in the controller (its work queue, its
// maps, its logs): NAMESPACE/NAME, as cache.MetaNamespaceKeyFunc.
func jobKey(namespace, name string) string { return namespace + "/" + name }

// coordJob is the id of a job at the coordinator, the one its ranks use
// too (shm.KubeJobID: NAMESPACE.NAME, whatever the job's kind).
func coordJob(namespace, name string) (string, error) {
	id, err := shm.KubeJobID(namespace, name)
	if err != nil {
		return "", fmt.Errorf("kube: job %s/%s: %w", namespace, name, err)
	}
	return id, nil
}

// mpiJobs is the MPIJob workload.
var mpiJobs workload = mpiJobKind{}

type mpiJobKind struct{}

func (mpiJobKind) Kind() string                          { return "MPIJob" }
func (mpiJobKind) Resource() schema.GroupVersionResource { return MPIJobs }
func (mpiJobKind) podLabel() string                      { return labelJobName }
func (mpiJobKind) recreator() string                     { return "mpi-operator" }
func (mpiJobKind) gang() string                          { return "pods, the launcher Job" }

func (mpiJobKind) shapeOf(u *unstructured.Unstructured) (shape, error) { return shapeOf(u) }
func (mpiJobKind) finished(u *unstructured.Unstructured) string        { return finished(u) }
func (mpiJobKind) managedElsewhere(u *unstructured.Unstructured) string {
	return managedElsewhere(u)
}

func (mpiJobKind) deleteGang(ctx context.Context, d *MPIJobDriver, u *unstructured.Unstructured, before time.Time, deadNode string) (int, error) {
	return d.deleteGang(ctx, u.GetNamespace(), u.GetName(), before, deadNode)
}

func (mpiJobKind) elastic(s shape, minSize uint32) error {
	ms := s.(mpiShape)
	if int64(minSize) > ms.worldSize() {
		return fmt.Errorf("the least world size %d is above the job's %d (%s)", minSize, ms.worldSize(), ms)
	}
	return nil
}

// resize sets the workers so that they hold worldSize ranks: an elastic
// recovery keeps whole nodes' ranks, one worker's slots each.
func (mpiJobKind) resize(s shape, worldSize uint32) (map[string]any, error) {
	ms := s.(mpiShape)
	if worldSize == 0 || int64(worldSize)%ms.slotsPerWorker != 0 {
		return nil, fmt.Errorf("world size %d is not a whole number of workers of %d slots", worldSize, ms.slotsPerWorker)
	}
	workers := int64(worldSize) / ms.slotsPerWorker
	return map[string]any{"spec": map[string]any{"mpiReplicaSpecs": map[string]any{"Worker": map[string]any{"replicas": workers}}}}, nil
}

// mpiShape is the part of an MPIJob's spec that decides its ranks.
type mpiShape struct {
	workers        int64
	slotsPerWorker int64
}

func (s mpiShape) worldSize() int64 { return s.workers * s.slotsPerWorker }

func (s mpiShape) String() string {
	return fmt.Sprintf("%d workers × %d slots", s.workers, s.slotsPerWorker)
}

func (s mpiShape) placement(pods []*corev1.Pod) (map[uint32]string, bool) {
	return placementOf(s, pods)
}

// shapeOf reads spec.mpiReplicaSpecs.Worker.replicas and
// spec.slotsPerWorker (default 1, as mpi-operator's defaulting).
func shapeOf(u *unstructured.Unstructured) (mpiShape, error) {
	w, found, err := unstructured.NestedInt64(u.Object, "spec", "mpiReplicaSpecs", "Worker", "replicas")
	if err != nil || !found || w < 1 {
		return mpiShape{}, fmt.Errorf("kube: MPIJob %s/%s: spec.mpiReplicaSpecs.Worker.replicas missing or below 1", u.GetNamespace(), u.GetName())
	}
	s, found, err := unstructured.NestedInt64(u.Object, "spec", "slotsPerWorker")
	if err != nil {
		return mpiShape{}, fmt.Errorf("kube: MPIJob %s/%s: spec.slotsPerWorker: %w", u.GetNamespace(), u.GetName(), err)
	}
	if !found {
		s = 1
	}
	if s < 1 {
		return mpiShape{}, fmt.Errorf("kube: MPIJob %s/%s: spec.slotsPerWorker %d below 1", u.GetNamespace(), u.GetName(), s)
	}
	// With runLauncherAsWorker mpi-operator puts the launcher first in the
	// hostfile: ranks 0..slots-1 would run on the launcher, and every rank
	// of a worker would be slotsPerWorker higher than placementOf says.
	if law, _, _ := unstructured.NestedBool(u.Object, "spec", "runLauncherAsWorker"); law {
		return mpiShape{}, fmt.Errorf("kube: MPIJob %s/%s: spec.runLauncherAsWorker is not supported (ranks on the launcher)", u.GetNamespace(), u.GetName())
	}
	return mpiShape{workers: w, slotsPerWorker: s}, nil
}

// finished says why mpi-operator will never again create pods for the
// MPIJob ("" if it will): its sync stops for good once a Succeeded or
// Failed condition is True and status.completionTime is set (set when
// the launcher Job completed or failed, e.g. past runPolicy.backoffLimit).
// A Failed condition without completionTime (evicted workers) does not
// stop it.
func finished(u *unstructured.Unstructured) string {
	if _, ok, _ := unstructured.NestedString(u.Object, "status", "completionTime"); !ok {
		return ""
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		typ, _ := m["type"].(string)
		st, _ := m["status"].(string)
		if (typ == "Succeeded" || typ == "Failed") && st == string(corev1.ConditionTrue) {
			reason, _ := m["reason"].(string)
			return fmt.Sprintf("%s (%s)", typ, reason)
		}
	}
	return ""
}

// mpiOperator is runPolicy.managedBy's value for mpi-operator itself.
const mpiOperator = "kubeflow.org/mpi-operator"

// managedElsewhere returns the controller named by spec.runPolicy.managedBy
// when it is not mpi-operator (MultiKueue: the pods run in another
// cluster, and mpi-operator here skips the MPIJob), or "".
func managedElsewhere(u *unstructured.Unstructured) string {
	m, _, _ := unstructured.NestedString(u.Object, "spec", "runPolicy", "managedBy")
	if m == mpiOperator {
		return ""
	}
	return m
}

// placementOf maps every rank of a worker pod that is scheduled (and not
// on its way out) to the pod's node: rank = worker index × slotsPerWorker
// + local rank. complete says whether every rank has a node.
func placementOf(shape mpiShape, pods []*corev1.Pod) (placement map[uint32]string, complete bool) {
	placement = map[uint32]string{}
	for _, p := range pods {
		if p.Labels[labelJobRole] != roleWorker || p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
			continue
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			continue
		}
		i, err := strconv.ParseInt(p.Labels[labelReplicaIndex], 10, 64)
		if err != nil || i < 0 || i >= shape.workers {
			continue
		}
		for l := range shape.slotsPerWorker {
			placement[uint32(i*shape.slotsPerWorker+l)] = p.Spec.NodeName
		}
	}
	return placement, int64(len(placement)) == shape.worldSize()
}
