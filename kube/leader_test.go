package kube

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Leader failover on a fake clientset: A leads and acts; A's lease
// renewals start failing (A cut off from the API server); A stops acting
// within its renew deadline and LeaderElect tells it so; B takes the lease
// once it expires and acts. client-go's elector runs on real time (no
// injectable clock), so this test uses a lease of two seconds and waits on channels, bounded by a timeout.
func TestLeaderFailover(t *testing.T) {
	kube := kubefake.NewClientset()
	aCut := make(chan struct{})
	kube.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		select {
		case <-aCut:
			if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "a" {
				return true, nil, errors.New("connection refused")
			}
		default:
		}
		return false, nil, nil
	})
	// The Lease counts whole seconds. The renew deadline is well before
	// the lease's end: a stops acting at the one, b may take over after
	// the other, and the 3 s between them is the margin a loaded machine
	// needs to run a's stopping (1 s was not enough at load 40).
	lc := LeaderConfig{Namespace: "rewind", Name: "coord", LeaseDuration: 4 * time.Second,
		RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	type replica struct {
		acting, stopped chan struct{}
		done            chan error
		leading         atomic.Bool // what OnLeading said last: the coordinator serves only then
	}
	start := func(id string) *replica {
		r := &replica{acting: make(chan struct{}), stopped: make(chan struct{}), done: make(chan error, 1)}
		l := lc
		l.Identity = id
		l.OnLeading = r.leading.Store
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go func() {
			r.done <- LeaderElect(ctx, kube, l, log, func(ctx context.Context) error {
				close(r.acting)
				<-ctx.Done()
				close(r.stopped)
				return nil
			})
		}()
		return r
	}
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	a := start("a")
	wait(a.acting, "a to lead")
	b := start("b")
	select {
	case <-b.acting:
		t.Fatal("b acts while a holds the lease")
	case <-time.After(lc.LeaseDuration + 5*lc.RetryPeriod):
	}
	if !a.leading.Load() || b.leading.Load() {
		t.Fatalf("leading: a %v, b %v; want only a", a.leading.Load(), b.leading.Load())
	}
	close(aCut)
	wait(a.stopped, "a to stop acting")
	select {
	case <-b.acting:
		t.Fatal("b acted before a stopped") // a stops at its renew deadline, before the lease expires
	default:
	}
	select {
	case err := <-a.done:
		if !errors.Is(err, ErrLostLeadership) {
			t.Fatalf("a's LeaderElect = %v, want ErrLostLeadership", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a's LeaderElect did not return")
	}
	if a.leading.Load() {
		t.Fatal("a still says it leads after losing the lease")
	}
	wait(b.acting, "b to take over")
	if !b.leading.Load() {
		t.Fatal("b acts but does not say it leads")
	}
	checkPermitted(t, kube.Actions())
}

// A lease duration set shorter than the default renew deadline (the
// chart's coordinator.leaseDuration) shortens the renew deadline and the
// retry period to what client-go accepts, instead of failing the
// coordinator at every start.
func TestShortLeaseDuration(t *testing.T) {
	lc := DefaultLeaderConfig()
	lc.Identity = "a"
	lc.LeaseDuration = 6 * time.Second
	f := lc.fitted()
	if f.RenewDeadline != 4*time.Second || f.RetryPeriod != 2*time.Second {
		t.Fatalf("renew deadline %v, retry %v; want 4s and 2s", f.RenewDeadline, f.RetryPeriod)
	}
	lc.LeaseDuration = 3 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := LeaderElect(ctx, kubefake.NewClientset(), lc, slog.New(slog.NewTextHandler(io.Discard, nil)), func(context.Context) error {
		cancel() // led: enough
		return nil
	})
	if err != nil {
		t.Fatalf("LeaderElect with a 3s lease: %v", err)
	}
	d := DefaultLeaderConfig()
	if f := d.fitted(); f.RenewDeadline != d.RenewDeadline || f.RetryPeriod != d.RetryPeriod {
		t.Fatalf("the defaults were changed: %v %v", f.RenewDeadline, f.RetryPeriod)
	}
}
