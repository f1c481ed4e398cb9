package kube

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
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
		if cfg.CABundle.Name != "" {
			go publishCABundle(ctx, kube, cfg.CABundle, cfg.Logger)
		}
		for {
			// Informers and controller are built afresh for each term, so
			// a new leader starts from what the API server says now; and
			// again within a term once JobSets become served (their CRD
			// installed after the coordinator started).
			cfg := cfg
			cfg.JobSets = servesJobSets(kube.Discovery(), cfg.Logger)
			cctx, cancel := context.WithCancel(ctx)
			appeared := make(chan struct{})
			if !cfg.JobSets {
				go awaitJobSets(cctx, kube.Discovery(), appeared, cancel)
			}
			ki, di := Informers(kube, dyn, cfg.Resync)
			c, err := New(cfg, kube, dyn, coord, recorder, ki, di)
			if err == nil {
				err = c.Run(cctx)
			}
			cancel()
			select {
			case <-appeared:
				if ctx.Err() == nil {
					cfg.Logger.Info("kube: JobSets are served now; the controller restarts to manage them")
					continue
				}
			default:
			}
			return err
		}
	})
}

// jobSetPoll is how often a controller without JobSets asks whether the
// API server serves them now.
const jobSetPoll = 30 * time.Second

// awaitJobSets closes appeared and cancels the controller once the API
// server serves JobSets, or returns when ctx ends.
func awaitJobSets(ctx context.Context, dc discovery.DiscoveryInterface, appeared chan<- struct{}, cancel context.CancelFunc) {
	quiet := slog.New(slog.DiscardHandler)
	t := time.NewTicker(jobSetPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if servesJobSets(dc, quiet) {
				close(appeared)
				cancel()
				return
			}
		}
	}
}

// servesJobSets reports whether the API server serves JobSets (the
// JobSet CRD is installed). Discovery needs no RBAC rule beyond the
// default system:discovery role.
func servesJobSets(dc discovery.DiscoveryInterface, log *slog.Logger) bool {
	list, err := dc.ServerResourcesForGroupVersion(JobSets.GroupVersion().String())
	if err != nil {
		if !apierrors.IsNotFound(err) {
			log.Warn("kube: cannot tell whether JobSets are served; not managing them", "err", err)
		} else {
			log.Info("kube: JobSets are not served (no JobSet CRD); managing MPIJobs only")
		}
		return false
	}
	for _, r := range list.APIResources {
		if r.Name == JobSets.Resource {
			return true
		}
	}
	return false
}
