//go:build tools

// Package jobsetbin builds the real JobSet controller (sigs.k8s.io/jobset,
// the version pinned in go.mod; its main package is the module root) from
// the Go module proxy for the end-to-end tests: `make kube-bin` builds it
// into bin/. A module of its own keeps JobSet's Kubernetes libraries at
// the versions it was released with.
package jobsetbin

import _ "sigs.k8s.io/jobset"
