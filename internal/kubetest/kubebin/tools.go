//go:build tools

// Package kubebin builds the Kubernetes control plane the end-to-end tests
// run against (kube-apiserver, kube-controller-manager) from the Go module
// proxy, at the version pinned in go.mod. `make kube-bin` builds them into
// bin/.
package kubebin

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
