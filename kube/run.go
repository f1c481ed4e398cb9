package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
)

// NewRecorder returns an EventRecorder writing Events to the API server
// as "rewind-coordinator", and the function that stops it.
func NewRecorder(kube kubernetes.Interface) (record.EventRecorder, func()) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "rewind-coordinator"}), b.Shutdown
}

// RestConfig is the in-cluster configuration, or kubeconfig's when set.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kube: kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("kube: not in a cluster (and no --kubeconfig): %w", err)
	}
	return cfg, nil
}

// Run runs the controller against the cluster of restCfg while this
// replica holds the leader Lease; see LeaderElect for how it ends.
func Run(ctx context.Context, restCfg *rest.Config, cfg Config, lc LeaderConfig, coord Coordinator) error {
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kube: %w", err)
	}
	dyn, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kube: %w", err)
	}
	recorder, stop := NewRecorder(kube)
	defer stop()
	return LeaderElect(ctx, kube, lc, cfg.Logger, func(ctx context.Context) error {
		// Informers and controller are built afresh for each term, so a
		// new leader starts from what the API server says now.
		ki, di := Informers(kube, dyn, cfg.Resync)
		c, err := New(cfg, kube, dyn, coord, recorder, ki, di)
		if err != nil {
			return err
		}
		return c.Run(ctx)
	})
}
