package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"

	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/enroll"
	"rewind.dev/rewind/kube"
	"rewind.dev/rewind/transport"
)

// coordEnrollFlags are the coordinator's flags for node enrollment
// (coordinator.EnrollConfig): agents prove their node with a Kubernetes
// service-account token and get their own certificate.
type coordEnrollFlags struct {
	caDir, serviceAccount, audience, configMap string
	validity                                   time.Duration
}

func (e *coordEnrollFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&e.caDir, "enroll-ca", "", "with --kube: directory of the CA that signs nodes' certificates (ca.crt and ca.key, or a cert-manager CA Secret's tls.crt and tls.key); "+
		"agents with a projected service-account token enroll for their node's own certificate (empty: off)")
	fs.StringVar(&e.serviceAccount, "enroll-service-account", "", "the agents' service account, NAMESPACE/NAME: only its tokens enroll")
	fs.StringVar(&e.audience, "enroll-audience", "rewind", "audience the agents' projected tokens are issued for")
	fs.DurationVar(&e.validity, "enroll-validity", 24*time.Hour, "validity of the certificates issued; agents renew when a third is left")
	fs.StringVar(&e.configMap, "enroll-ca-configmap", "", "ConfigMap (in the coordinator's namespace) the leader publishes the CA certificate in, key ca.crt, for agents to trust on first contact (empty: none)")
}

// config returns the enrollment configuration, nil when off; the CA
// bundle is published by the controller of k.
func (e *coordEnrollFlags) config(k *kubeFlags) (*coordinator.EnrollConfig, error) {
	if e.caDir == "" {
		return nil, nil
	}
	if !k.on {
		return nil, errors.New("--enroll-ca needs --kube: the API server reviews the agents' tokens")
	}
	if err := kube.ParseServiceAccount(e.serviceAccount); err != nil {
		return nil, fmt.Errorf("--enroll-service-account: %w", err)
	}
	if e.validity < time.Minute {
		return nil, fmt.Errorf("--enroll-validity %v: want at least a minute", e.validity)
	}
	ca, err := transport.LoadCA(e.caDir)
	if err != nil {
		return nil, fmt.Errorf("--enroll-ca: %w", err)
	}
	restCfg, err := kube.RestConfig(k.kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	r := &kube.TokenReviewer{Client: client, Audience: e.audience, ServiceAccount: e.serviceAccount}
	if e.configMap != "" {
		k.cfg.CABundle = kube.CABundle{Namespace: k.lease.Namespace, Name: e.configMap, PEM: ca.PEM}
	}
	return &coordinator.EnrollConfig{CA: ca, NodeOf: r.NodeOf, Validity: e.validity}, nil
}

// agentEnrollFlags are the agent's flags for enrollment.
type agentEnrollFlags struct {
	token, ca string
	limit     time.Duration
}

func (e *agentEnrollFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&e.token, "enroll-token", "", "file of a token proving this node (a projected service-account token): the agent enrolls with the coordinator for its node's own certificate, "+
		"written into --tls-dir, and renews it (empty: off, --tls-dir holds a certificate already)")
	fs.StringVar(&e.ca, "enroll-ca", "", "CA bundle the coordinator's certificate is checked against at the first enrollment (the cluster's ca.crt)")
	fs.DurationVar(&e.limit, "enroll-timeout", 5*time.Minute, "how long the agent tries to enroll at start before it gives up")
}

// ensure enrolls when the agent has no certificate of its node (or one
// due for renewal), before its transport is loaded, and returns what
// keeps it renewed; nil when enrollment is off.
func (e *agentEnrollFlags) ensure(ctx context.Context, tlf *tlsFlags, node, coord string, log *slog.Logger) (func(context.Context), error) {
	if e.token == "" {
		if e.ca != "" {
			return nil, errors.New("--enroll-ca without --enroll-token")
		}
		return nil, nil
	}
	cfg := enroll.Config{Dir: tlf.dir, Node: node, Coordinator: coord, CAFile: e.ca, TokenFile: e.token, TrustDomain: tlf.trustDomain, Logger: log}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := cfg.Ensure(ctx, e.limit); err != nil {
		return nil, err
	}
	return cfg.Keep, nil
}
