package coordinator

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/transport"
)

// EnrollConfig turns on Enroll: agents with no certificate get their
// node's own, signed by CA, once NodeOf says which node their token
// proves (docs/design/20261128_node_enrollment.md).
type EnrollConfig struct {
	// CA signs the nodes' certificates; its certificate is what the
	// cluster trusts (every daemon's ca.crt).
	CA *transport.CA
	// NodeOf returns the node a token proves its holder runs on, or why
	// the token proves nothing (kube.TokenReviewer.NodeOf in Kubernetes).
	NodeOf func(ctx context.Context, token string) (string, error)
	// Validity of the certificates issued; an agent enrolls again when a
	// third of it is left.
	Validity time.Duration
	// TrustDomain of the identities issued; empty: the default.
	TrustDomain string
}

// maxTokenBytes bounds an enrollment token: a Kubernetes service-account
// token is about 1 KiB.
const maxTokenBytes = 16 << 10

// Enroll issues the caller its node's certificate if its token proves the
// node it names.
func (s *server) Enroll(ctx context.Context, req *coordpb.EnrollRequest) (*coordpb.EnrollResponse, error) {
	e := s.c.cfg.Enroll
	if e == nil {
		return nil, status.Error(codes.FailedPrecondition, "coordinator: enrollment is off: this coordinator was started without --enroll-ca")
	}
	switch {
	case shm.ValidateNode(req.Node) != nil:
		return nil, toStatus(fmt.Errorf("%w: coordinator: enroll: %w", ErrInvalid, shm.ValidateNode(req.Node)))
	case req.Token == "" || len(req.Token) > maxTokenBytes:
		return nil, toStatus(fmt.Errorf("%w: coordinator: enroll: a token of %d bytes (want 1 to %d)", ErrInvalid, len(req.Token), maxTokenBytes))
	}
	node, err := e.NodeOf(ctx, req.Token)
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil, toStatus(err)
	case err != nil:
		return nil, status.Errorf(codes.Unauthenticated, "coordinator: enroll %s: the token proves no node: %v", req.Node, err)
	case node != req.Node:
		return nil, status.Errorf(codes.PermissionDenied, "coordinator: enroll %s: the token proves node %s, not %s", req.Node, node, req.Node)
	}
	certPEM, err := e.CA.SignCSR(req.Csr, transport.Leaf{Identity: transport.Identity{Role: transport.RoleNode, Name: node},
		TrustDomain: e.TrustDomain, Validity: e.Validity})
	if err != nil {
		return nil, toStatus(fmt.Errorf("%w: coordinator: enroll %s: %w", ErrInvalid, node, err))
	}
	// The expiry is the certificate's own (SignCSR bounds it by the CA's).
	block, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, toStatus(fmt.Errorf("coordinator: enroll %s: the certificate signed: %w", node, err))
	}
	notAfter := cert.NotAfter
	s.c.log.Info("node enrolled", "node", node, "not_after", notAfter.UTC().Format(time.RFC3339))
	return &coordpb.EnrollResponse{Certificate: certPEM, Ca: e.CA.PEM, Node: node, NotAfterUnixNano: notAfter.UnixNano()}, nil
}
