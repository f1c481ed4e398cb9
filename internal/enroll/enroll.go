// Package enroll keeps a node's certificate directory filled from the
// coordinator: an agent started with a token and no certificate of its
// own makes a key, sends a certificate request with the token
// (coordinator.Enroll), and writes the certificate the coordinator signs
// for the node the token proves, beside the key, in the directory its
// transport reads (and reads again when the files change). It enrolls
// again when a third of the certificate's validity is left. The key never
// leaves the node (docs/design/20261128_node_enrollment.md).
package enroll

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/transport"
)

// Config says where and how a node enrolls.
type Config struct {
	Dir         string // the certificate directory the agent's transport reads (tls.crt, tls.key, ca.crt)
	Node        string // the node's name: what the certificate must name
	Coordinator string // the coordinator's address
	// CAFile is the CA bundle the coordinator's certificate is checked
	// against on the first enrollment (the cluster's ca.crt); later ones
	// use the ca.crt the coordinator returned.
	CAFile string
	// TokenFile holds the token that proves the node, read anew at each
	// enrollment (the kubelet rotates a projected token in place).
	TokenFile   string
	TrustDomain string
	Logger      *slog.Logger
}

// Validate reports what is missing.
func (c Config) Validate() error {
	var missing []string
	for name, v := range map[string]string{"--tls-dir": c.Dir, "--node": c.Node, "--coordinator": c.Coordinator, "--enroll-ca": c.CAFile, "--enroll-token": c.TokenFile} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("enroll: enrollment needs %s", strings.Join(missing, ", "))
	}
	return nil
}

// renewAt is when a certificate valid from nb to na is renewed: when a
// third of its validity is left.
func renewAt(nb, na time.Time) time.Time { return na.Add(-na.Sub(nb) / 3) }

// Current returns the validity of the node's certificate in the
// directory, or an error saying why there is none to keep (missing, of
// another identity, expired, not matching its key).
func (c Config) Current(now time.Time) (notBefore, notAfter time.Time, err error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(c.Dir, transport.CertFile), filepath.Join(c.Dir, transport.KeyFile))
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	id, err := transport.IdentityOf(cert.Leaf, c.trustDomain())
	switch {
	case err != nil:
		return time.Time{}, time.Time{}, err
	case id != transport.Identity{Role: transport.RoleNode, Name: c.Node}:
		return time.Time{}, time.Time{}, fmt.Errorf("the certificate names %s, not node/%s", id, c.Node)
	case !now.Before(cert.Leaf.NotAfter):
		return time.Time{}, time.Time{}, fmt.Errorf("the certificate expired at %s", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return cert.Leaf.NotBefore, cert.Leaf.NotAfter, nil
}

func (c Config) trustDomain() string {
	if c.TrustDomain == "" {
		return transport.DefaultTrustDomain
	}
	return c.TrustDomain
}

// Once enrolls now, whatever the directory holds, and returns the new
// certificate's expiry.
func (c Config) Once(ctx context.Context) (time.Time, error) {
	caPEM, err := os.ReadFile(filepath.Join(c.Dir, transport.CAFile))
	if err != nil || len(caPEM) == 0 {
		if caPEM, err = os.ReadFile(c.CAFile); err != nil {
			return time.Time{}, fmt.Errorf("enroll: the CA bundle: %w", err)
		}
	}
	token, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return time.Time{}, fmt.Errorf("enroll: the token: %w", err)
	}
	csr, keyPEM, err := transport.NewCSR()
	if err != nil {
		return time.Time{}, err
	}
	conn, err := transport.EnrollClient(c.Coordinator, caPEM, c.TrustDomain)
	if err != nil {
		return time.Time{}, err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := coordpb.NewCoordinatorClient(conn).Enroll(cctx, &coordpb.EnrollRequest{Csr: csr,
		Token: strings.TrimSpace(string(token)), Node: c.Node})
	if err != nil {
		return time.Time{}, fmt.Errorf("enroll: node %s with the coordinator at %s: %w", c.Node, c.Coordinator, err)
	}
	// The pair must load, and name this node, before it replaces anything.
	if _, err := tls.X509KeyPair(resp.Certificate, keyPEM); err != nil {
		return time.Time{}, fmt.Errorf("enroll: the coordinator's certificate does not fit the key: %w", err)
	}
	if err := transport.WriteDir(c.Dir, resp.Certificate, keyPEM, resp.Ca); err != nil {
		return time.Time{}, fmt.Errorf("enroll: writing %s: %w", c.Dir, err)
	}
	_, na, err := c.Current(time.Now())
	if err != nil {
		return time.Time{}, fmt.Errorf("enroll: the certificate written to %s: %w", c.Dir, err)
	}
	return na, nil
}

// Retry is how long Ensure and Keep wait between failed enrollments.
var Retry = 5 * time.Second

// Ensure returns once the directory holds a certificate of the node with
// more than a third of its validity left, enrolling (again, every Retry)
// if it does not, until limit passes or ctx ends.
func (c Config) Ensure(ctx context.Context, limit time.Duration) (time.Time, error) {
	log := c.logger()
	if nb, na, err := c.Current(time.Now()); err == nil && time.Now().Before(renewAt(nb, na)) {
		return na, nil
	} else if err == nil {
		log.Info("node certificate due for renewal: enrolling", "node", c.Node, "not_after", na.UTC().Format(time.RFC3339))
	} else if !errors.Is(err, os.ErrNotExist) {
		log.Info("no usable node certificate: enrolling", "node", c.Node, "why", err)
	}
	deadline := time.Now().Add(limit)
	for {
		na, err := c.Once(ctx)
		if err == nil {
			log.Info("node enrolled", "node", c.Node, "dir", c.Dir, "not_after", na.UTC().Format(time.RFC3339))
			return na, nil
		}
		if time.Now().Add(Retry).After(deadline) {
			return time.Time{}, fmt.Errorf("%w (gave up after %v)", err, limit)
		}
		log.Warn("enrollment failed; trying again", "err", err, "in", Retry)
		if err := clock.Sleep(ctx, Retry); err != nil {
			return time.Time{}, err
		}
	}
}

// Keep renews the certificate in the directory when a third of its
// validity is left, until ctx ends; a failed renewal is tried again every
// Retry while the certificate lasts (and after: the agent's connections
// fail meanwhile, and come back once it is renewed).
func (c Config) Keep(ctx context.Context) {
	log := c.logger()
	failed := false
	for {
		wait := Retry
		if nb, na, err := c.Current(time.Now()); err == nil && !failed {
			wait = max(time.Until(renewAt(nb, na)), 0)
		}
		if clock.Sleep(ctx, wait) != nil {
			return
		}
		if nb, na, err := c.Current(time.Now()); err == nil && time.Now().Before(renewAt(nb, na)) {
			failed = false
			continue // renewed meanwhile
		}
		na, err := c.Once(ctx)
		if failed = err != nil; failed {
			log.Warn("node certificate renewal failed; trying again", "err", err, "in", Retry)
		} else {
			log.Info("node certificate renewed", "node", c.Node, "not_after", na.UTC().Format(time.RFC3339))
		}
	}
}

func (c Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.Default()
	}
	return c.Logger
}
