package kube

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// sinceRegang leaves out the pods of a gang that was restarted: those
// created before rewind.dev/regang-at are on their way out (their
// deletion may not have reached the cache yet) and must not count as the
// job's placement.
func sinceRegang(u *unstructured.Unstructured, pods []*corev1.Pod) []*corev1.Pod {
	at, err := time.Parse(time.RFC3339, u.GetAnnotations()[AnnRegangAt])
	if err != nil {
		return pods
	}
	var out []*corev1.Pod
	for _, p := range pods {
		if !p.CreationTimestamp.Time.Before(at) {
			out = append(out, p)
		}
	}
	return out
}

// placeShards makes sure the step a restarted gang restores is in the
// memory of the nodes its new pods landed on. The coordinator restored
// it onto the recovery's placement, but the scheduler, not rewind, places
// the recreated workers; once every rank's pod is placed (and
// registered), a restore onto that placement fetches what is missing
// (a shard already in a node's memory is not fetched again). Done once
// per re-gang: rewind.dev/placed-regang records it.
func (c *Controller) placeShards(ctx context.Context, u *unstructured.Unstructured, job string, shape shape, pods []*corev1.Pod) error {
	ann := u.GetAnnotations()
	id := ann[AnnRegangID]
	if id == "" || ann[AnnPlacedID] == id {
		return nil
	}
	if _, complete := shape.placement(pods); !complete {
		return nil // the pods' events bring us back
	}
	step, err := strconv.ParseInt(ann[AnnRestoringStep], 10, 64)
	if err != nil {
		return nil // not written by us
	}
	res, err := c.coord.Restore(ctx, job, step, "rewind controller: gang rescheduled ("+id+")")
	if err != nil {
		return fmt.Errorf("kube: placing step %d of %s on its new pods' nodes: %w", step, job, err)
	}
	c.log.Info("kube: restored step on the new placement", "job", job, "step", res.Step, "regang_id", id)
	c.recorder.Eventf(u, corev1.EventTypeNormal, ReasonShardsPlaced, "step %d is in memory on every rank's new node", res.Step)
	return c.driver.annotate(ctx, u, map[string]any{AnnPlacedID: id})
}
