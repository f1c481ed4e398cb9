package tiers

import (
	"fmt"
	"slices"
	"strings"
)

// Name names a durable tier. There are three, listed by Names nearest
// first: the order a restore tries them in. The protocol carries a Name as
// a string; the code that reads one off the wire converts it there, with
// ParseName where an unknown name is an error to report.
type Name string

const (
	// NVMe is a node-local drive: a copy there is the shards of the ranks
	// that ran on its node.
	NVMe Name = "nvme"
	// PFS is a parallel filesystem mounted on every node.
	PFS Name = "pfs"
	// S3 is an S3-compatible object store.
	S3 Name = "s3"
)

// names is the one list of tiers, nearest first.
var names = [...]Name{NVMe, PFS, S3}

// Names returns every tier, nearest (cheapest to restore from) first.
func Names() []Name { return slices.Clone(names[:]) }

// Valid reports whether n is one of Names.
func (n Name) Valid() bool { return slices.Contains(names[:], n) }

// NodeLocal reports whether a tier's store is private to one node (a
// local NVMe drive) rather than shared by every node (a parallel
// filesystem, an object store). A node-local tier holds the shards of the
// ranks that ran on its node.
func (n Name) NodeLocal() bool { return n == NVMe }

// ParseName returns the tier named s, or an error listing the tiers.
func ParseName(s string) (Name, error) {
	if n := Name(s); n.Valid() {
		return n, nil
	}
	return "", fmt.Errorf("tiers: unknown tier %q: want one of %s", s, nameList())
}

// nameList is "nvme, pfs, s3", for messages.
func nameList() string {
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = string(n)
	}
	return strings.Join(s, ", ")
}
