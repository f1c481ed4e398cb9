package kube

import (
	"fmt"
	"strconv"
	"strings"

	"rewind.dev/rewind/tiers"
)

// Annotations read on an MPIJob.
const (
	AnnCheckpoint  = "rewind.dev/checkpoint"
	AnnReplicas    = "rewind.dev/replicas"
	AnnPolicy      = "rewind.dev/policy"
	AnnRestoreStep = "rewind.dev/restore-step"
	AnnElastic     = "rewind.dev/elastic"
)

// Annotations the controller writes.
const (
	AnnRestoringStep = "rewind.dev/restoring-step"
	AnnRegangID      = "rewind.dev/regang-id"
	AnnRestoreResult = "rewind.dev/restore-result"
	AnnRegangAt      = "rewind.dev/regang-at"     // when the gang was restarted (RFC 3339)
	AnnPlacedID      = "rewind.dev/placed-regang" // the regang whose shards are on the new pods' nodes
)

// TaintUnhealthy is the taint key put on a node declared dead.
const TaintUnhealthy = "rewind.dev/unhealthy"

// maxReplicas bounds rewind.dev/replicas: more copies than this is a typo.
const maxReplicas = 16

// jobSpec is what a managed MPIJob's annotations ask for.
type jobSpec struct {
	replicas *uint32
	policy   string
	// minWorldSize is rewind.dev/elastic's minimum ("min=N"), 0 when the
	// annotation is absent (elastic recovery off).
	minWorldSize uint32
	// restore is set when an operator asked for a restore; restoreStep < 0
	// is the newest restorable step.
	restore     bool
	restoreStep int64
}

// annotationError names the annotation that is wrong and why.
type annotationError struct {
	Key, Value, Problem string
}

func (e *annotationError) Error() string {
	return fmt.Sprintf("kube: annotation %s=%q: %s", e.Key, e.Value, e.Problem)
}

// managed reports whether the annotations ask rewind to manage the job.
func managed(ann map[string]string) bool {
	return ann[AnnCheckpoint] == "enabled"
}

// parseSpec reads a managed job's annotations; the first bad one is an
// *annotationError.
func parseSpec(ann map[string]string) (jobSpec, error) {
	var s jobSpec
	if v, ok := ann[AnnReplicas]; ok {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
		if err != nil {
			return s, &annotationError{AnnReplicas, v, "not a whole number of copies"}
		}
		if n > maxReplicas {
			return s, &annotationError{AnnReplicas, v, fmt.Sprintf("at most %d copies", maxReplicas)}
		}
		r := uint32(n)
		s.replicas = &r
	}
	if v, ok := ann[AnnPolicy]; ok {
		if _, err := tiers.ParsePolicy(v); err != nil {
			return s, &annotationError{AnnPolicy, v, err.Error()}
		}
		s.policy = v
	}
	if v, ok := ann[AnnElastic]; ok {
		t, found := strings.CutPrefix(strings.TrimSpace(v), "min=")
		n, err := strconv.ParseUint(t, 10, 32)
		if !found || err != nil || n < 1 {
			return s, &annotationError{AnnElastic, v, `not "min=N", N the least world size (at least 1) the job may shrink to`}
		}
		s.minWorldSize = uint32(n)
	}
	if v, ok := ann[AnnRestoreStep]; ok {
		s.restore, s.restoreStep = true, -1
		if t := strings.TrimSpace(v); t != "latest" {
			n, err := strconv.ParseInt(t, 10, 64)
			if err != nil || n < 0 {
				return s, &annotationError{AnnRestoreStep, v, `not a step number (or "latest")`}
			}
			s.restoreStep = n
		}
	}
	return s, nil
}
