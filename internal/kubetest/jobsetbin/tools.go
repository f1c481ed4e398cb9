//go:build tools

// Package jobsetbin builds the real JobSet controller (sigs.k8s.io/jobset;
// its main package is the module root) and the real Kubeflow Trainer v2
// controller (github.com/kubeflow/trainer/v2) from the Go module proxy,
// at the versions pinned in go.mod, for the end-to-end tests: `make
// kube-bin` builds them into bin/. One module for the two, both
// controller-runtime controllers: the Trainer is built against the JobSet
// API of the JobSet controller the tests install (newer than the one it
// was released with) and the same controller-runtime, so that those are
// compiled once. Their Kubernetes libraries stay an older minor than the
// control plane's (kubebin): controller-runtime of that minor does not
// build against the control plane's client-go.
package jobsetbin

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/jobset"
)
