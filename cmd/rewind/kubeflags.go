package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync/atomic"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/kube"
	"rewind.dev/rewind/transport"
)

// kubeFlags are the coordinator's flags for the Kubernetes controller.
type kubeFlags struct {
	on         bool
	kubeconfig string
	jobKey     string
	cfg        kube.Config
	lease      kube.LeaderConfig
	leading    atomic.Bool // this replica holds the lease
	// sec is the coordinator's own transport: the controller dials the
	// coordinator with its certificate.
	sec *transport.Security
}

// leadingFunc is the coordinator's Config.Leading: with --kube, whether
// this replica leads; nil (always serving) without.
func (k *kubeFlags) leadingFunc() func() bool {
	if !k.on {
		return nil
	}
	k.lease.OnLeading = k.leading.Store
	return k.leading.Load
}

func (k *kubeFlags) register(fs *flag.FlagSet) {
	k.cfg, k.lease = kube.DefaultConfig(), kube.DefaultLeaderConfig()
	fs.BoolVar(&k.on, "kube", false, "run the Kubernetes controller (annotated MPIJobs, node faults), with leader election")
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig for --kube (default: the in-cluster configuration)")
	fs.StringVar(&k.jobKey, "job-key", "", "with --kube, the agents' job key file: each managed job gets a Secret NAME-rewind-token holding its token, for its pods to mount")
	fs.DurationVar(&k.cfg.NodeGrace, "kube-node-grace", k.cfg.NodeGrace, "how long a Node stays NotReady before its jobs are recovered elsewhere")
	fs.StringVar(&k.lease.Namespace, "kube-lease-namespace", envOr("POD_NAMESPACE", k.lease.Namespace), "namespace of the leader Lease")
	fs.StringVar(&k.lease.Name, "kube-lease", k.lease.Name, "name of the leader Lease")
	fs.StringVar(&k.lease.Identity, "kube-identity", envOr("POD_NAME", k.lease.Identity), "this replica's name in the leader election")
	fs.DurationVar(&k.lease.LeaseDuration, "kube-lease-duration", k.lease.LeaseDuration, "how long a leader's lease lasts unrenewed")
}

// loadJobKey reads --job-key into the controller's configuration.
func (k *kubeFlags) loadJobKey() error {
	if k.jobKey == "" {
		return nil
	}
	if !k.on {
		return fmt.Errorf("--job-key is for the Kubernetes controller: it needs --kube")
	}
	var err error
	k.cfg.JobKeys, err = jobtoken.Load(k.jobKey)
	return err
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// ready returns the coordinator's ready callback: with --kube, it starts
// the controller against the coordinator's own gRPC address; errs gets
// the controller's end (a lost lease: the process should exit).
func (k *kubeFlags) ready(ctx context.Context, log *slog.Logger, errs chan<- error) func(grpcAddr, metricsAddr string) {
	if !k.on {
		return nil
	}
	return func(grpcAddr, _ string) {
		go func() { errs <- k.run(ctx, log, grpcAddr) }()
	}
}

func (k *kubeFlags) run(ctx context.Context, log *slog.Logger, grpcAddr string) error {
	restCfg, err := kube.RestConfig(k.kubeconfig)
	if err != nil {
		return err
	}
	_, port, err := net.SplitHostPort(grpcAddr)
	if err != nil {
		return fmt.Errorf("kube: coordinator address %s: %w", grpcAddr, err)
	}
	conn, err := k.sec.NewClient(net.JoinHostPort("localhost", port), transport.ExpectCoordinator)
	if err != nil {
		return err
	}
	defer conn.Close()
	k.cfg.Logger = log
	return kube.Run(ctx, restCfg, k.cfg, k.lease, kube.GRPCCoordinator{API: coordpb.NewCoordinatorClient(conn)})
}

// runWithKube runs the coordinator and, with --kube, its controller; a
// controller that ends (a lost lease) ends the coordinator, so that it
// restarts as a candidate.
func runWithKube(ctx context.Context, c interface {
	Run(context.Context, func(string, string)) error
}, k *kubeFlags, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 1)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, k.ready(ctx, log, errs)) }()
	select {
	case err := <-done:
		return err
	case err := <-errs:
		if ctx.Err() != nil { // shutting down
			return <-done
		}
		cancel()
		<-done
		if err == nil {
			err = kube.ErrLostLeadership
		}
		return fmt.Errorf("coordinator: kube controller ended: %w", err)
	}
}
