package transport

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Enrollment gives a node its own certificate without a shared secret:
// the agent makes a key and a certificate request, and the coordinator
// (coordinator.Enroll) signs it for the node that a token proves the
// agent runs on (in Kubernetes, a service-account token bound to a pod on
// that node, checked with a TokenReview). The request's subject and names
// are not read: the identity is the signer's to say. Docs:
// docs/design/20261128_node_enrollment.md.

// NewCSR makes a new P-256 key and a certificate request signed with it.
// The key, PEM-encoded, stays with the caller: it never leaves the node.
func NewCSR() (csrDER, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{"rewind"}}}, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return csrDER, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// MaxCSRBytes bounds a certificate request: a P-256 request is about 200
// bytes, an RSA-4096 one under 2 KiB.
const MaxCSRBytes = 8 << 10

// SignCSR signs the key of a certificate request for leaf's identity and
// validity, after checking the request's own signature (its holder has
// the key). It returns the certificate, PEM-encoded.
func (ca *CA) SignCSR(csrDER []byte, leaf Leaf) ([]byte, error) {
	if len(csrDER) == 0 || len(csrDER) > MaxCSRBytes {
		return nil, fmt.Errorf("transport: a certificate request of %d bytes (want 1 to %d)", len(csrDER), MaxCSRBytes)
	}
	if err := leaf.Identity.Validate(); err != nil {
		return nil, err
	}
	if leaf.Identity.Role == RoleNode && leaf.Identity.Name == AnyNode {
		return nil, errors.New("transport: enrollment issues a node its own certificate, never one for every node")
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("transport: certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("transport: certificate request not signed by its key: %w", err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve.Params().BitSize < 256 {
			return nil, fmt.Errorf("transport: certificate request: a %d-bit ECDSA key (want at least 256)", k.Curve.Params().BitSize)
		}
	default:
		return nil, fmt.Errorf("transport: certificate request: a %T key (want ECDSA)", csr.PublicKey)
	}
	leaf.DNSNames, leaf.IPs = nil, nil
	if leaf.NotBefore.IsZero() && leaf.NotAfter.IsZero() {
		// Backdated for peers whose clocks are a little behind, by a
		// tenth of a short validity: a node renews when a third is left.
		now := time.Now()
		leaf.NotBefore, leaf.NotAfter = now.Add(-min(time.Hour, leaf.Validity/10)), now.Add(leaf.Validity)
	}
	return ca.sign(csr.PublicKey, leaf)
}

// EnrollClient returns a gRPC client of the coordinator at target that
// presents no certificate of its own, for Enroll, the one method such a
// caller may call: the server's chain is checked against caPEM, and its
// identity in trustDomain ("" for DefaultTrustDomain) must be a
// coordinator's.
func EnrollClient(target string, caPEM []byte, trustDomain string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if trustDomain == "" {
		trustDomain = DefaultTrustDomain
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("transport: enrollment: the CA bundle holds no PEM certificate")
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // the chain and the identity are checked below, not the host name
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("transport: the server sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: time.Now(),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("transport: server: certificate %q not trusted: %w", subject(leaf), err)
			}
			id, err := IdentityOf(leaf, trustDomain)
			if err != nil {
				return fmt.Errorf("transport: server: %w", err)
			}
			return ExpectCoordinator.check(id)
		},
		NextProtos: []string{protoH2},
	}
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("transport: %s: %w", target, err)
	}
	return conn, nil
}
