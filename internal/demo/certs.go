package demo

import (
	"fmt"
	"path/filepath"
	"time"

	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/membership"
	"rewind.dev/rewind/transport"
)

// demoOperator names the demo's own client of the coordinator.
const demoOperator = "demo"

// makeCerts makes the cluster's certificate authority and a certificate
// for the coordinator, each node and the demo itself (an operator), as
// `rewind certs` does (a gossip key too), under the demo's directory: every TCP connection
// of the demo is mutual TLS. With Plaintext, none, and the daemons
// listen in plaintext on loopback.
func (d *cluster) makeCerts() error {
	if d.cfg.Plaintext {
		d.tl.log("tls", "off (--plaintext): plaintext TCP on loopback addresses")
		return nil
	}
	d.certs = filepath.Join(d.lc.Tmp, "certs")
	ca, err := transport.NewCA("rewind demo CA", 24*time.Hour)
	if err != nil {
		return err
	}
	gossipKeys := [][]byte{membership.NewKey()}
	issue := func(dir string, id transport.Identity) error {
		if err := ca.IssueDir(filepath.Join(d.certs, dir), transport.Leaf{Identity: id, Validity: 24 * time.Hour}); err != nil {
			return fmt.Errorf("demo: certificate of %s: %w", id, err)
		}
		if id.Role == transport.RoleOperator { // not a member of gossip
			return nil
		}
		return membership.WriteKeyFile(filepath.Join(d.certs, dir, membership.KeyFileName), gossipKeys)
	}
	if err := issue("coordinator", transport.Identity{Role: transport.RoleCoordinator, Name: "coordinator"}); err != nil {
		return err
	}
	if err := issue("operator", transport.Identity{Role: transport.RoleOperator, Name: demoOperator}); err != nil {
		return err
	}
	for i := range d.cfg.Nodes {
		if err := issue(filepath.Join("node", nodeName(i)), transport.Identity{Role: transport.RoleNode, Name: nodeName(i)}); err != nil {
			return err
		}
	}
	if d.sec, err = transport.Load(filepath.Join(d.certs, "operator"), nil); err != nil {
		return err
	}
	d.tl.log("tls", "mutual TLS 1.3 on every TCP connection, encrypted gossip: a CA, certificates for the coordinator, %d nodes (each its own) and the demo (an operator), and a gossip key in %s",
		d.cfg.Nodes, d.certs)
	return nil
}

// makeJobKey writes the agents' job key (--job-key) and mints the job's
// token, which its ranks present: a process without it reaches nothing of
// the job through an agent's socket, as in production.
func (d *cluster) makeJobKey() error {
	d.jobKey = filepath.Join(d.lc.Tmp, "job.key")
	if err := jobtoken.WriteFile(d.jobKey); err != nil {
		return err
	}
	keys, err := jobtoken.Load(d.jobKey)
	if err != nil {
		return err
	}
	d.jobToken = keys.Token(jobName)
	d.tl.log("jobs", "the agents isolate jobs (--job-key %s): the ranks of job %s present its token", d.jobKey, jobName)
	return nil
}

// tlsArgs are the flags of a daemon whose certificate is in dir (under
// the demo's certificates).
func (d *cluster) tlsArgs(dir string) []string {
	if d.certs == "" {
		return nil
	}
	return []string{"--tls-dir", filepath.Join(d.certs, dir)}
}

func nodeName(i int) string { return fmt.Sprintf("node-%d", i) }
