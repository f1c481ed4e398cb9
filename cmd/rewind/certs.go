package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/membership"
	"rewind.dev/rewind/transport"
)

// runCerts is `rewind certs`: a certificate authority and the
// certificates of a cluster without a PKI of its own, one directory per
// identity in the layout every daemon's --tls-dir reads:
//
//	OUT/ca/               ca.crt, ca.key (kept: a later run issues from it)
//	OUT/coordinator/      coordinator/NAME
//	OUT/node/NODE/        node/NODE, one per --nodes
//	OUT/node/shared/      node/* with --shared-node (every node's)
//	OUT/operator/         operator/NAME
//	OUT/reader/           reader/NAME
//	OUT/gossip.keys       the cluster's gossip keys (kept: a later run reuses them),
//	                      copied into the coordinator's and each node's directory
//	OUT/job.key           the agents' job key (--job-key; kept): a rank reaches
//	                      its own job's checkpoints only (rewind job-token JOB)
//
// Run again, it issues new certificates from the same CA into the same
// directories: running daemons pick them up at their next handshake. It
// copies OUT/gossip.keys again too: that is how a rotation of gossip keys
// reaches the daemons (docs/operations.md).
func runCerts(_ context.Context, args []string) error {
	fs := newFlagSet("certs", "certs --out DIR [--nodes a,b,...] [flags]",
		"Creates a certificate authority (or reuses the one in DIR/ca) and issues the certificates a cluster needs.")
	out := fs.String("out", "", "directory to write into (required)")
	nodes := fs.String("nodes", "", "node names, comma-separated: one node certificate each")
	shared := fs.Bool("shared-node", false, "also issue one node certificate every node may share (node/*: it may report for any node)")
	coord := fs.String("coordinator", "coordinator", "the coordinator's name (empty: no coordinator certificate)")
	hosts := fs.String("hosts", "", "extra DNS names or IPs for the coordinator's certificate, comma-separated (for tools that check host names)")
	operator := fs.String("operator", defaultOperator(), "the operator's name (empty: no operator certificate)")
	reader := fs.String("reader", "reader", "the reader's name (empty: no reader certificate)")
	days := fs.Int("days", 365, "validity of the certificates issued, in days")
	caDays := fs.Int("ca-days", 3650, "validity of a new certificate authority, in days")
	domain := fs.String("trust-domain", transport.DefaultTrustDomain, "trust domain of the identities (spiffe://DOMAIN/ROLE/NAME)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *out == "":
		return usageError(fs, errors.New("--out is required"))
	case *days < 1 || *caDays < 1:
		return usageError(fs, errors.New("--days and --ca-days must be positive"))
	}
	ca, fresh, err := loadOrMakeCA(filepath.Join(*out, "ca"), time.Duration(*caDays)*24*time.Hour)
	if err != nil {
		return err
	}
	if fresh {
		fmt.Printf("created a certificate authority in %s (keep ca.key secret; ca.crt is what every member trusts)\n", filepath.Join(*out, "ca"))
	} else {
		fmt.Printf("issuing from the certificate authority in %s\n", filepath.Join(*out, "ca"))
	}
	validity := time.Duration(*days) * 24 * time.Hour
	issue := func(dir string, id transport.Identity, dns []string) error {
		leaf := transport.Leaf{Identity: id, TrustDomain: *domain, Validity: validity}
		for _, h := range dns {
			if ip := net.ParseIP(h); ip != nil {
				leaf.IPs = append(leaf.IPs, ip)
			} else if h != "" && h != transport.AnyNode {
				leaf.DNSNames = append(leaf.DNSNames, h)
			}
		}
		path := filepath.Join(*out, dir)
		if err := ca.IssueDir(path, leaf); err != nil {
			return fmt.Errorf("certs: %s: %w", id, err)
		}
		fmt.Printf("  %-24s %s\n", path, id.SPIFFE(*domain))
		return nil
	}
	keys, err := loadOrMakeGossipKeys(filepath.Join(*out, membership.KeyFileName))
	if err != nil {
		return err
	}
	issue = withGossipKeys(issue, *out, keys)
	if err := keepJobKey(filepath.Join(*out, "job.key")); err != nil {
		return err
	}
	local := []string{"localhost", "127.0.0.1", "::1"}
	if *coord != "" {
		if err := issue("coordinator", transport.Identity{Role: transport.RoleCoordinator, Name: *coord}, append(append([]string{*coord}, local...), split(*hosts)...)); err != nil {
			return err
		}
	}
	for _, n := range split(*nodes) {
		if err := issue(filepath.Join("node", n), transport.Identity{Role: transport.RoleNode, Name: n}, append([]string{n}, local...)); err != nil {
			return err
		}
	}
	if *shared {
		if err := issue(filepath.Join("node", "shared"), transport.Identity{Role: transport.RoleNode, Name: transport.AnyNode}, local); err != nil {
			return err
		}
	}
	if *operator != "" {
		if err := issue("operator", transport.Identity{Role: transport.RoleOperator, Name: *operator}, nil); err != nil {
			return err
		}
	}
	if *reader != "" {
		if err := issue("reader", transport.Identity{Role: transport.RoleReader, Name: *reader}, nil); err != nil {
			return err
		}
	}
	fmt.Printf("valid for %d days; daemons take --tls-dir DIR, operator commands --tls-dir or $%s\n", *days, EnvTLSDir)
	return nil
}

// loadOrMakeGossipKeys reads the cluster's gossip key file, or writes
// one with a new key.
func loadOrMakeGossipKeys(path string) ([][]byte, error) {
	if _, err := os.Stat(path); err == nil {
		return membership.ReadKeyFile(path)
	}
	keys := [][]byte{membership.NewKey()}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	if err := membership.WriteKeyFile(path, keys); err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	fmt.Printf("created the cluster's gossip key in %s\n", path)
	return keys, nil
}

// keepJobKey writes the agents' job key file unless there is one.
func keepJobKey(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := jobtoken.WriteFile(path); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	fmt.Printf("created the agents' job key in %s (--job-key; a rank's token: rewind job-token --key %s JOB)\n", path, path)
	return nil
}

// withGossipKeys makes issue also write the gossip keys into the
// directories of the coordinator and the nodes (the members of gossip).
func withGossipKeys(issue func(string, transport.Identity, []string) error, out string, keys [][]byte) func(string, transport.Identity, []string) error {
	return func(dir string, id transport.Identity, dns []string) error {
		if err := issue(dir, id, dns); err != nil {
			return err
		}
		if id.Role != transport.RoleCoordinator && id.Role != transport.RoleNode {
			return nil
		}
		if err := membership.WriteKeyFile(filepath.Join(out, dir, membership.KeyFileName), keys); err != nil {
			return fmt.Errorf("certs: %s: %w", id, err)
		}
		return nil
	}
}

// loadOrMakeCA reads the CA in dir, or makes one there if there is none.
func loadOrMakeCA(dir string, validity time.Duration) (*transport.CA, bool, error) {
	if _, err := os.Stat(filepath.Join(dir, transport.CAKeyFile)); err == nil {
		ca, err := transport.LoadCA(dir)
		return ca, false, err
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, err
	}
	ca, err := transport.NewCA("rewind CA", validity)
	if err != nil {
		return nil, false, err
	}
	return ca, true, ca.WriteCA(dir)
}

func defaultOperator() string {
	if u := os.Getenv("USER"); u != "" && !strings.ContainsAny(u, "/ ") {
		return u
	}
	return "admin"
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
