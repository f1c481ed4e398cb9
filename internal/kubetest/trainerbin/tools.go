//go:build tools

// Package trainerbin builds the real Kubeflow Trainer v2 controller
// (github.com/kubeflow/trainer/v2, the version pinned in go.mod) from the
// Go module proxy for the end-to-end tests: `make kube-bin` builds it
// into bin/. A module of its own keeps the Trainer's Kubernetes libraries
// at the versions it was released with.
package trainerbin

import _ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
