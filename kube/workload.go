package kube

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// workload is a kind of training job the controller manages: Kubeflow's
// MPIJob (mpiJobs) or a JobSet (jobSets). The controller, the driver and
// the annotations are the same for every kind; what differs is here: how
// the spec decides the ranks, which pods are the job's, when the kind's
// own controller stops recreating them, and how the gang is deleted for
// it to recreate. Implementations are stateless values, safe for
// concurrent use.
type workload interface {
	// Kind is the object's kind, as Events and messages name it.
	Kind() string
	// Resource is what the controller watches, reads and patches.
	Resource() schema.GroupVersionResource
	// podLabel is the label its controller puts on every pod of a job,
	// whose value is the job's name.
	podLabel() string
	// shapeOf reads the ranks off the spec (and the kind's annotations:
	// an *annotationError when one is wrong).
	shapeOf(u *unstructured.Unstructured) (shape, error)
	// finished says why the kind's controller will never again create
	// the job's pods ("" if it will).
	finished(u *unstructured.Unstructured) string
	// managedElsewhere names the controller of spec.*.managedBy when it is
	// not the kind's own (the pods run in another cluster), or "".
	managedElsewhere(u *unstructured.Unstructured) string
	// recreator is who recreates a deleted gang, and gang what the driver
	// deletes, for Events.
	recreator() string
	gang() string
	// deleteGang deletes what of job u's gang was created before before,
	// for recreator to recreate; a pod on a dead node goes with no grace
	// period. It returns how many objects it deleted.
	deleteGang(ctx context.Context, d *MPIJobDriver, u *unstructured.Unstructured, before time.Time, deadNode string) (int, error)
	// elastic checks that a job of shape may shrink to minSize ranks
	// (rewind.dev/elastic); resize returns the merge patch of the spec
	// that makes a job of shape worldSize ranks, for an elastic recovery.
	elastic(s shape, minSize uint32) error
	resize(s shape, worldSize uint32) (map[string]any, error)
}

// shape is the part of a job's spec that decides its ranks.
type shape interface {
	worldSize() int64
	// placement maps every rank of a pod that is scheduled (and not on its
	// way out) to the pod's node; complete says whether every rank has one.
	placement(pods []*corev1.Pod) (placement map[uint32]string, complete bool)
	// String says how the ranks come about, e.g. "2 workers × 2 slots".
	String() string
}

// workloadOf is the kind of u (an MPIJob unless it is a JobSet).
func workloadOf(u *unstructured.Unstructured) workload {
	if u.GroupVersionKind().Group == JobSets.Group {
		return jobSets
	}
	return mpiJobs
}
