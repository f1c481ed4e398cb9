package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"rewind.dev/rewind/api/coordpb"
)

// syncJob brings the coordinator in step with MPIJob key (syncWorkload).
func (c *Controller) syncJob(ctx context.Context, key string) error {
	return c.syncWorkload(ctx, item{key: key})
}

// syncWorkload brings the coordinator in step with job it (an MPIJob or
// a JobSet): registers it (world size, placement, policy, replicas) when
// managed, follows its recoveries, and runs the restore an operator asked
// for.
func (c *Controller) syncWorkload(ctx context.Context, it item) error {
	w, key := it.workload(), it.key
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil // not a key we made: nothing to retry
	}
	obj, err := c.lister(w).ByNamespace(ns).Get(name)
	if isNotFound(err) {
		c.forgetJob(it)
		return nil
	}
	if err != nil {
		return err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || !managed(u.GetAnnotations()) {
		c.forgetJob(it)
		return nil
	}
	spec, err := parseSpec(u.GetAnnotations())
	var ae *annotationError
	if errors.As(err, &ae) {
		c.report(it, u, ReasonInvalidAnnotation, fmt.Sprintf("annotation %s=%q: %s; the job is left as it was", ae.Key, ae.Value, ae.Problem))
		return nil
	}
	shape, err := w.shapeOf(u)
	if errors.As(err, &ae) {
		c.report(it, u, ReasonInvalidAnnotation, fmt.Sprintf("annotation %s=%q: %s; the job is left as it was", ae.Key, ae.Value, ae.Problem))
		return nil
	}
	if err != nil {
		c.report(it, u, ReasonInvalidSpec, err.Error())
		return nil
	}
	if m := spec.minWorldSize; m > 0 {
		if err := w.elastic(shape, m); err != nil {
			c.report(it, u, ReasonInvalidAnnotation, fmt.Sprintf("annotation %s=%q: %v; the job is left as it was", AnnElastic, u.GetAnnotations()[AnnElastic], err))
			return nil
		}
	}
	if other := c.sameID(w, ns, name); other != "" {
		c.report(it, u, ReasonInvalidSpec, fmt.Sprintf("its job id at the coordinator, %s.%s, is the managed %s %s/%s's: rename one of them", ns, name, other, ns, name))
		return nil
	}
	c.clearReport(it)
	pods, err := c.jobPods(w, ns, name)
	if err != nil {
		return err
	}
	pods = sinceRegang(u, pods)
	id, err := coordJob(ns, name)
	if err != nil {
		c.report(it, u, ReasonInvalidSpec, err.Error())
		return nil
	}
	if err := c.register(ctx, it, u, id, spec, shape, pods); err != nil {
		return err
	}
	c.startFollow(ctx, it, id, c.driver.forKind(w, ns, name))
	if err := c.placeShards(ctx, u, id, shape, pods); err != nil {
		return err
	}
	if spec.restore {
		return c.operatorRestore(ctx, u, id, spec)
	}
	return nil
}

// register sends the job to the coordinator when what it would send
// changed since the last time.
func (c *Controller) register(ctx context.Context, it item, u *unstructured.Unstructured, id string, spec jobSpec, shape shape, pods []*corev1.Pod) error {
	key := it.key
	placement, complete := shape.placement(pods)
	req := &coordpb.RegisterJobRequest{
		Job: id, WorldSize: uint32(shape.worldSize()), Placement: placement,
		Policy: spec.policy, Replicas: spec.replicas,
		MinWorldSize: &spec.minWorldSize, // 0 without the annotation: off, as the job's annotations say
	}
	sig := registration(req)
	c.mu.Lock()
	prev, known := c.registered[it]
	c.mu.Unlock()
	if prev == sig {
		return nil
	}
	if err := c.coord.RegisterJob(ctx, req); err != nil {
		return fmt.Errorf("kube: registering %s: %w", id, err)
	}
	if err := c.ensureToken(ctx, u, id); err != nil {
		return err // not recorded as registered: retried with the registration
	}
	c.mu.Lock()
	c.registered[it] = sig
	c.mu.Unlock()
	c.log.Info("kube: job registered", strings.ToLower(it.workload().Kind()), key, "job", id, "world_size", req.WorldSize, "placed", len(placement), "policy", spec.policy)
	if !known {
		c.recorder.Eventf(u, corev1.EventTypeNormal, ReasonRegistered,
			"rewind manages this job as %s: %d ranks (%s)", id, req.WorldSize, shape)
		if b, ok, _ := unstructured.NestedInt64(u.Object, "spec", "runPolicy", "backoffLimit"); it.workload() == mpiJobs && ok && b < jobDefaultBackoffLimit {
			c.recorder.Eventf(u, corev1.EventTypeWarning, ReasonRegangAtRisk,
				"spec.runPolicy.backoffLimit %d: once a node fails, the launcher's mpirun fails on every retry until rewind restarts the gang (up to %v after the node's kubelet stops); "+
					"with fewer retries than Kubernetes' default %d the launcher Job may fail first, and mpi-operator then marks the MPIJob Failed for good",
				b, c.cfg.NodeGrace+kubeletNodeGrace, jobDefaultBackoffLimit)
		}
	}
	if !complete {
		c.log.Info("kube: job not fully placed yet", strings.ToLower(it.workload().Kind()), key, "job", id, "placed", len(placement), "world_size", req.WorldSize)
	}
	return nil
}

// jobDefaultBackoffLimit is a batch/v1 Job's default spec.backoffLimit,
// which the launcher Job gets when runPolicy.backoffLimit is not set.
const jobDefaultBackoffLimit = 6

// kubeletNodeGrace is how long the node lifecycle controller waits for a
// silent kubelet before it sets the Node's Ready condition Unknown
// (kube-controller-manager --node-monitor-grace-period: 40s, 50s since
// Kubernetes 1.32).
const kubeletNodeGrace = 50 * time.Second

// registration is req as comparable text.
func registration(req *coordpb.RegisterJobRequest) string {
	s := fmt.Sprintf("%d|%s|%d|", req.WorldSize, req.Policy, req.GetMinWorldSize())
	if req.Replicas != nil {
		s += strconv.FormatUint(uint64(*req.Replicas), 10)
	}
	for _, r := range slices.Sorted(maps.Keys(req.Placement)) {
		s += fmt.Sprintf("|%d=%s", r, req.Placement[r])
	}
	return s
}

// operatorRestore runs the restore asked by rewind.dev/restore-step: the
// coordinator restores the step and restarts the job at it, and its
// regang event restarts the gang through the driver, as a recovery's does
// (Follow). The annotation is removed first, so that the restore runs
// once however often the job is synced; rewind.dev/restore-result says
// how it went. A failed restore is not retried until an operator asks
// again.
func (c *Controller) operatorRestore(ctx context.Context, u *unstructured.Unstructured, id string, spec jobSpec) error {
	// The lister may lag: read the MPIJob fresh, so a restore already
	// handled is not run again and the annotation patch below applies.
	u, err := c.driver.Dyn.Resource(workloadOf(u).Resource()).Namespace(u.GetNamespace()).Get(ctx, u.GetName(), metav1.GetOptions{})
	if err != nil {
		return err
	}
	if _, ok := u.GetAnnotations()[AnnRestoreStep]; !ok {
		return nil
	}
	who := requester(u)
	claim := map[string]any{AnnRestoreStep: nil, AnnRestoreResult: fmt.Sprintf("restoring step %s (asked by %s)", stepText(spec.restoreStep), who)}
	if err := c.driver.annotate(ctx, u, claim); err != nil {
		return err // changed meanwhile: the next sync reads it again
	}
	res, err := c.coord.Restart(ctx, id, spec.restoreStep, who)
	if err != nil {
		msg := fmt.Sprintf("restore of step %s asked by %s failed: %v", stepText(spec.restoreStep), who, err)
		c.log.Warn("kube: operator restore failed", "job", id, "step", spec.restoreStep, "requested_by", who, "err", err)
		c.recorder.Event(u, corev1.EventTypeWarning, ReasonRestoreFailed, msg)
		return c.driver.setResult(ctx, u, "failed: "+msg)
	}
	c.log.Info("kube: operator restore", "job", id, "step", res.Step, "requested_by", who, "ranks", len(res.Ranks), "deleted_steps", res.DroppedSteps)
	c.recorder.Eventf(u, corev1.EventTypeNormal, ReasonRestored, "step %d restored onto %d ranks, asked by %s; the gang restarts at it (later steps deleted: %v)",
		res.Step, len(res.Ranks), who, res.DroppedSteps)
	return c.driver.setResult(ctx, u, fmt.Sprintf("restored step %d (asked by %s)", res.Step, who))
}

func stepText(step int64) string {
	if step < 0 {
		return "latest"
	}
	return strconv.FormatInt(step, 10)
}

// requester names who set rewind.dev/restore-step: the field manager that
// owns it (kubectl, a pipeline), as far as the API server tells.
func requester(u *unstructured.Unstructured) string {
	for _, mf := range u.GetManagedFields() {
		if mf.FieldsV1 != nil && strings.Contains(mf.FieldsV1.GetRawString(), `"f:`+AnnRestoreStep+`"`) {
			return mf.Manager
		}
	}
	return "annotation " + AnnRestoreStep
}

// report records problem as a Warning Event on the job, once per problem.
func (c *Controller) report(it item, u *unstructured.Unstructured, reason, problem string) {
	c.mu.Lock()
	seen := c.reported[it] == problem
	c.reported[it] = problem
	c.mu.Unlock()
	if !seen {
		c.log.Warn("kube: job left as it was", "job", it.key, "kind", it.workload().Kind(), "reason", reason, "problem", problem)
		c.recorder.Event(u, corev1.EventTypeWarning, reason, problem)
	}
}

func (c *Controller) clearReport(it item) {
	c.mu.Lock()
	delete(c.reported, it)
	c.mu.Unlock()
}

// forgetJob stops managing a job that is gone or no longer annotated.
func (c *Controller) forgetJob(it item) {
	c.stopFollow(it)
	c.mu.Lock()
	delete(c.registered, it)
	delete(c.reported, it)
	c.mu.Unlock()
}

// sameID names the other kind of a managed job with the name of job ns/name
// of kind w ("" if none): both would be job NAMESPACE.NAME at the
// coordinator. The MPIJob keeps the id; the JobSet is refused.
func (c *Controller) sameID(w workload, ns, name string) string {
	if w != jobSets {
		return ""
	}
	obj, err := c.lister(mpiJobs).ByNamespace(ns).Get(name)
	if err != nil {
		return ""
	}
	if u, ok := obj.(*unstructured.Unstructured); ok && managed(u.GetAnnotations()) {
		return mpiJobs.Kind()
	}
	return ""
}
