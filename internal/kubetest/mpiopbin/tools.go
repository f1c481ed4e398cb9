//go:build tools

// Package mpiopbin builds the real mpi-operator (kubeflow/mpi-operator,
// the version pinned in go.mod) from the Go module proxy for the
// end-to-end tests: `make kube-bin` builds it into bin/. A module of its
// own keeps mpi-operator's Kubernetes libraries at the versions it was
// released with.
package mpiopbin

import _ "github.com/kubeflow/mpi-operator/cmd/mpi-operator"
