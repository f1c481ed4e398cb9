package kube

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/utils/clock"

	"rewind.dev/rewind/internal/jobtoken"
)

// Config configures the controller.
type Config struct {
	// NodeGrace is how long a Node's Ready condition must stay False or
	// Unknown before its jobs are recovered elsewhere.
	NodeGrace time.Duration
	// Workers is the number of goroutines processing the work queue.
	Workers int
	// JobSets makes the controller manage JobSets (jobset.x-k8s.io) too.
	// Run sets it when the API server serves JobSets (their CRD
	// installed); an informer of a resource that is not served never
	// syncs and would stop the controller.
	JobSets bool
	// Resync is the informers' resync period.
	Resync time.Duration
	// JobKeys, when set, makes the controller create each managed job's
	// token Secret (TokenSecretName) in the job's namespace, for its
	// pods to mount; the agents check the tokens with the same keys.
	JobKeys jobtoken.Keys
	// CABundle, when named, is published by the leader (cabundle.go):
	// the CA agents enroll with.
	CABundle CABundle
	// Clock decides the grace; tests pass a fake one.
	Clock  clock.WithTicker
	Logger *slog.Logger
}

// DefaultConfig returns the configuration a coordinator runs with.
func DefaultConfig() Config {
	return Config{
		NodeGrace: 40 * time.Second, // on top of kube-controller-manager's node-monitor-grace-period (a Node is Unknown after 40s of kubelet silence, 50s since 1.32): a further 40s rules out a blip
		Workers:   2,                // the work is API calls, one per event; two keep a slow call from blocking the rest
		Resync:    10 * time.Minute, // a safety net only: every change arrives as an event
		Clock:     clock.RealClock{},
		Logger:    slog.Default(),
	}
}

// Validate reports a configuration the controller cannot run with.
func (c Config) Validate() error {
	var errs []error
	if c.NodeGrace < 0 {
		errs = append(errs, fmt.Errorf("kube: node grace %v is negative", c.NodeGrace))
	}
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("kube: %d workers: need at least 1", c.Workers))
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("kube: no clock"))
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("kube: no logger"))
	}
	return errors.Join(errs...)
}
