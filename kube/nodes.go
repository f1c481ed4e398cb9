package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// syncNode declares a node dead once its Ready condition has been False
// or Unknown for longer than the grace: NodeDown at the coordinator (which
// recovers its jobs; the drivers then restart their gangs), a taint so
// nothing is placed there again, and an Event on the Node. The taint
// marks the fault handled, so it is handled once however often the node
// is seen, by this leader or the next.
func (c *Controller) syncNode(ctx context.Context, name string) error {
	n, err := c.nodes.Get(name)
	if isNotFound(err) {
		return c.nodeDeleted(ctx, name)
	}
	if err != nil {
		return err
	}
	cond := readyCondition(n)
	if cond == nil || cond.Status == corev1.ConditionTrue {
		c.mu.Lock()
		delete(c.downed, name)
		c.mu.Unlock()
		return nil
	}
	if hasTaint(n, TaintUnhealthy) {
		return nil
	}
	c.mu.Lock()
	state := c.downed[name]
	c.mu.Unlock()
	switch state {
	case nodeTainted:
		return nil
	case nodeDeclared: // the taint failed last time
		return c.taint(ctx, n)
	}
	notReady := c.cfg.Clock.Since(cond.LastTransitionTime.Time)
	if wait := c.cfg.NodeGrace - notReady; wait > 0 {
		c.queue.AddAfter(item{node: true, key: name}, wait)
		return nil
	}
	reason := fmt.Sprintf("node %s Ready=%s for %v (%s)", name, cond.Status, notReady.Round(1e9), cond.Reason)
	jobs, err := c.coord.NodeDown(ctx, name, reason)
	if err != nil {
		return fmt.Errorf("kube: declaring node %s down: %w", name, err)
	}
	c.setDowned(name, nodeDeclared)
	c.log.Warn("kube: node declared down", "node", name, "reason", reason, "jobs", jobs)
	c.recorder.Eventf(n, corev1.EventTypeWarning, ReasonNodeDown, "%s: rewind recovers its jobs elsewhere (%s) and taints it %s:NoSchedule",
		reason, strings.Join(jobs, ", "), TaintUnhealthy)
	return c.taint(ctx, n)
}

// nodeDeleted declares a node that left the cluster outright (deleted,
// not NotReady first: a cloud instance gone, an operator's kubectl delete)
// down at once: there is no grace to wait for, and nothing to taint. A
// node the coordinator never knew (no agent ran there) is no concern.
func (c *Controller) nodeDeleted(ctx context.Context, name string) error {
	c.mu.Lock()
	state := c.downed[name]
	c.mu.Unlock()
	if state != "" {
		return nil
	}
	reason := fmt.Sprintf("node %s deleted from the cluster", name)
	jobs, err := c.coord.NodeDown(ctx, name, reason)
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kube: declaring deleted node %s down: %w", name, err)
	}
	c.setDowned(name, nodeTainted) // handled: there is no Node left to taint
	c.log.Warn("kube: node declared down", "node", name, "reason", reason, "jobs", jobs)
	return nil
}

func readyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// taint adds rewind.dev/unhealthy:NoSchedule to the node with a JSON
// patch that fails if the node changed since it was read (a retry
// re-reads it).
func (c *Controller) taint(ctx context.Context, n *corev1.Node) error {
	if err := taintNode(ctx, c.kube, n, c.cfg.Clock.Now()); err != nil {
		return err
	}
	c.setDowned(n.Name, nodeTainted)
	return nil
}

// taintNode adds rewind.dev/unhealthy:NoSchedule to n.
func taintNode(ctx context.Context, kube kubernetes.Interface, n *corev1.Node, at time.Time) error {
	now := metav1.NewTime(at)
	t := corev1.Taint{Key: TaintUnhealthy, Effect: corev1.TaintEffectNoSchedule, TimeAdded: &now}
	var ops []map[string]any
	if n.ResourceVersion != "" {
		ops = append(ops, map[string]any{"op": "test", "path": "/metadata/resourceVersion", "value": n.ResourceVersion})
	}
	if len(n.Spec.Taints) == 0 {
		ops = append(ops, map[string]any{"op": "add", "path": "/spec/taints", "value": []corev1.Taint{t}})
	} else {
		ops = append(ops, map[string]any{"op": "add", "path": "/spec/taints/-", "value": t})
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	if _, err := kube.CoreV1().Nodes().Patch(ctx, n.Name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("kube: tainting node %s: %w", n.Name, err)
	}
	return nil
}

// What this leader did about a node that is not Ready.
const (
	nodeDeclared = "declared" // NodeDown done
	nodeTainted  = "tainted"  // and the taint is on
)

func (c *Controller) setDowned(node, state string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.downed[node] = state
}
