//go:build tools

// Package kubebin builds the Kubernetes control plane the end-to-end tests
// run against (kube-apiserver, kube-controller-manager) and the real
// mpi-operator (kubeflow/mpi-operator) from the Go module proxy, at the
// versions pinned in go.mod: `make kube-bin` builds them into bin/. One
// module for the three: mpi-operator is built against the control plane's
// Kubernetes libraries (a newer minor than it was released with, which
// the end-to-end tests check it runs with), so that they are compiled
// once, not twice: on a 2-core machine that is most of mpi-operator's
// five-minute build.
package kubebin

import (
	_ "github.com/kubeflow/mpi-operator/cmd/mpi-operator"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
