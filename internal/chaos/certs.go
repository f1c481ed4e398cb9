package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/membership"
	"rewind.dev/rewind/transport"
)

// chaosOperator names the chaos runner's own client of the coordinator.
const chaosOperator = "chaos"

// makeCerts issues the compose cluster's certificates into a fresh
// directory, in `rewind certs`'s layout (the compose file mounts it as
// /certs, CHAOS_CERTS): the coordinator's, each node's own, and the
// runner's (an operator), and the gossip key beside the coordinator's and
// the nodes', and the agents' job key. Every TCP connection of the
// cluster is mutual TLS, its gossip is encrypted and its agents isolate
// jobs, as in production.
func (c *Cluster) makeCerts() error {
	dir, err := os.MkdirTemp("", "rewind-chaos-certs-")
	if err != nil {
		return err
	}
	// The containers read the files as root; the directory stays the
	// runner's alone on the host.
	ca, err := transport.NewCA("rewind chaos CA", 7*24*time.Hour)
	if err != nil {
		return err
	}
	gossipKeys := [][]byte{membership.NewKey()}
	issue := func(sub string, id transport.Identity) error {
		leaf := transport.Leaf{Identity: id, Validity: 7 * 24 * time.Hour}
		if err := ca.IssueDir(filepath.Join(dir, sub), leaf); err != nil {
			return fmt.Errorf("chaos: certificate of %s: %w", id, err)
		}
		if id.Role == transport.RoleOperator { // not a member of gossip
			return nil
		}
		return membership.WriteKeyFile(filepath.Join(dir, sub, membership.KeyFileName), gossipKeys)
	}
	if err := issue("coordinator", transport.Identity{Role: transport.RoleCoordinator, Name: svcCoordinator}); err != nil {
		return err
	}
	if err := issue("operator", transport.Identity{Role: transport.RoleOperator, Name: chaosOperator}); err != nil {
		return err
	}
	if err := issue("reader", transport.Identity{Role: transport.RoleReader, Name: chaosOperator}); err != nil {
		return err
	}
	for _, n := range nodeServices {
		if err := issue(filepath.Join("node", n), transport.Identity{Role: transport.RoleNode, Name: n}); err != nil {
			return err
		}
	}
	if c.sec, err = transport.Load(filepath.Join(dir, "operator"), nil); err != nil {
		return err
	}
	// The agents isolate jobs (--job-key /certs/job.key): each node's
	// supervisor hands its ranks their job's token.
	if err := jobtoken.WriteFile(filepath.Join(dir, "job.key")); err != nil {
		return err
	}
	c.Certs = dir
	return nil
}

// removeCerts removes the certificates once the cluster is gone.
func (c *Cluster) removeCerts() {
	if c.Certs != "" {
		os.RemoveAll(c.Certs)
	}
}
