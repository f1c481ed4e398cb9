package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaderConfig configures leader election on a coordination.k8s.io Lease.
type LeaderConfig struct {
	Namespace, Name string // the Lease
	Identity        string // this replica (the pod name)
	LeaseDuration   time.Duration
	RenewDeadline   time.Duration
	RetryPeriod     time.Duration
	// OnLeading, when set, is told when this replica starts and stops
	// leading (the coordinator serves only while it leads).
	OnLeading func(leading bool)
}

// DefaultLeaderConfig returns the election settings of a coordinator.
func DefaultLeaderConfig() LeaderConfig {
	host, _ := os.Hostname()
	return LeaderConfig{
		Namespace:     "rewind",
		Name:          "rewind-coordinator",
		Identity:      host,             // the pod name in a Deployment
		LeaseDuration: 15 * time.Second, // client-go's usual values: a dead leader is replaced within 15s
		RenewDeadline: 10 * time.Second, // a leader that cannot renew for 10s stops acting, 5s before the lease can be taken
		RetryPeriod:   2 * time.Second,  // how often candidates try
	}
}

// fitted returns lc with RenewDeadline and RetryPeriod shortened to fit a
// LeaseDuration set shorter than the defaults (--kube-lease-duration,
// the chart's coordinator.leaseDuration): client-go refuses a renew
// deadline that is not below the lease duration, or a retry period that
// does not fit 1.2 times in the renew deadline.
func (lc LeaderConfig) fitted() LeaderConfig {
	if lc.LeaseDuration > 0 && lc.RenewDeadline >= lc.LeaseDuration {
		lc.RenewDeadline = lc.LeaseDuration * 2 / 3
	}
	if lc.RenewDeadline > 0 && 6*lc.RetryPeriod >= 5*lc.RenewDeadline {
		lc.RetryPeriod = lc.RenewDeadline / 5
	}
	return lc
}

// ErrLostLeadership is returned by LeaderElect when this replica stopped
// being the leader while its context was still live: its caller should
// exit, so that it restarts as a candidate with fresh state.
var ErrLostLeadership = errors.New("kube: lost the leader lease")

// LeaderElect runs run while this replica holds the Lease: run's context
// ends when leadership is lost (the lease not renewed within
// RenewDeadline), and the lease is released when ctx ends. It returns
// when ctx ends or leadership is lost.
func LeaderElect(ctx context.Context, kube kubernetes.Interface, lc LeaderConfig, log *slog.Logger, run func(context.Context) error) error {
	if lc.Identity == "" {
		return errors.New("kube: leader election needs an identity")
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: lc.Namespace, Name: lc.Name},
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: lc.Identity},
	}
	lc = lc.fitted()
	var led atomic.Bool
	ran := make(chan error, 1) // run's result: OnStartedLeading runs on its own goroutine
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, Name: lc.Name,
		LeaseDuration: lc.LeaseDuration, RenewDeadline: lc.RenewDeadline, RetryPeriod: lc.RetryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				led.Store(true)
				if lc.OnLeading != nil {
					lc.OnLeading(true)
				}
				log.Info("kube: leading", "lease", lc.Namespace+"/"+lc.Name, "identity", lc.Identity)
				ran <- run(ctx)
			},
			OnStoppedLeading: func() {
				if lc.OnLeading != nil {
					lc.OnLeading(false)
				}
				log.Info("kube: not leading", "lease", lc.Namespace+"/"+lc.Name, "identity", lc.Identity)
			},
			OnNewLeader: func(id string) {
				if id != lc.Identity {
					log.Info("kube: leader is elsewhere", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("kube: leader election: %w", err)
	}
	le.Run(ctx)
	if !led.Load() {
		return nil
	}
	// Run cancelled run's context on its way out: wait for run to stop
	// acting, so that the caller knows it did.
	if err := <-ran; err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil
	}
	return ErrLostLeadership
}
