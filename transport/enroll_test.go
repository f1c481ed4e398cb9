package transport

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
)

// Only Enroll, and the readiness probe (which a kubelet asks with no
// certificate and which tells nothing), let a caller without a
// certificate through: any other method opened that way would be open to
// anyone who reaches the port.
func TestOnlyEnrollTakesUncertifiedCallers(t *testing.T) {
	for m, r := range Rules {
		if r.Uncertified != (m == coordpb.Coordinator_Enroll_FullMethodName || m == HTTPReady) {
			t.Errorf("%s: Uncertified %v", m, r.Uncertified)
		}
	}
}

// A signed request gets a certificate for the identity the signer names,
// whatever the request asked for, with the request's key; directory files
// written from it load as that node.
func TestSignCSRNamesTheSignersIdentity(t *testing.T) {
	p := newPKI(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "coordinator"},
		URIs: []*url.URL{Identity{RoleCoordinator, "c"}.URI(DefaultTrustDomain)}, DNSNames: []string{"evil.example"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := p.ca.SignCSR(csr, Leaf{Identity: Identity{RoleNode, "gpu-7"}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := IdentityOf(cert, DefaultTrustDomain); err != nil || id != (Identity{RoleNode, "gpu-7"}) {
		t.Fatalf("identity %v, %v; want node/gpu-7", id, err)
	}
	if !slices.Equal(cert.DNSNames, []string{"node.rewind"}) || !cert.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) {
		t.Fatalf("certificate names %v (want only node.rewind, the role's server name) or holds another key", cert.DNSNames)
	}
	if cert.NotAfter.After(time.Now().Add(time.Hour + time.Minute)) {
		t.Fatalf("valid until %v, asked for an hour", cert.NotAfter)
	}
}

func TestSignCSRRefuses(t *testing.T) {
	p := newPKI(t)
	good, _, err := NewCSR()
	if err != nil {
		t.Fatal(err)
	}
	tampered := append([]byte(nil), good...)
	tampered[len(tampered)-5] ^= 0xff // the signature
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaCSR, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, rsaKey)
	if err != nil {
		t.Fatal(err)
	}
	node := Leaf{Identity: Identity{RoleNode, "n1"}, Validity: time.Hour}
	cases := map[string]struct {
		csr  []byte
		leaf Leaf
		want string
	}{
		"empty":                 {nil, node, "0 bytes"},
		"too large":             {make([]byte, MaxCSRBytes+1), node, "bytes"},
		"not a request":         {[]byte("hello"), node, "certificate request"},
		"signature broken":      {tampered, node, "certificate request"},
		"an RSA key":            {rsaCSR, node, "want ECDSA"},
		"for every node":        {good, Leaf{Identity: Identity{RoleNode, AnyNode}, Validity: time.Hour}, "never one for every node"},
		"an identity with none": {good, Leaf{Validity: time.Hour}, "no role"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := p.ca.SignCSR(c.csr, c.leaf)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("SignCSR = %v, want an error with %q", err, c.want)
			}
		})
	}
}

// A cert-manager CA Secret (tls.crt, tls.key in PKCS #8) is a CA to sign
// with, as rewind certs' ca.crt and ca.key are.
func TestLoadCAFromACertManagerSecret(t *testing.T) {
	ca, err := NewCA("cm", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, CertFile), ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, KeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Cert.Equal(ca.Cert) || !got.Key.Equal(ca.Key) {
		t.Fatal("loaded another CA")
	}
	// A leaf's directory is not a CA.
	p := newPKI(t)
	if _, err := LoadCA(p.issue(Leaf{Identity: Identity{RoleNode, "n"}})); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Fatalf("LoadCA of a leaf = %v", err)
	}
}

// EnrollClient reaches the coordinator with no certificate and checks it:
// a server that is a node, or of another CA, is refused in the handshake.
func TestEnrollClientChecksTheServer(t *testing.T) {
	p := newPKI(t)
	other := newPKI(t)
	cases := map[string]struct {
		server *Security
		want   codes.Code
	}{
		"the coordinator":          {p.sec(Identity{RoleCoordinator, "c"}), codes.Unimplemented},
		"a node posing as one":     {p.sec(Identity{RoleNode, "n"}), codes.Unavailable},
		"a coordinator of another": {other.sec(Identity{RoleCoordinator, "c"}), codes.Unavailable},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			addr := serve(t, c.server)
			conn, err := EnrollClient(addr, p.ca.PEM, "")
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = coordpb.NewCoordinatorClient(conn).Enroll(ctx, &coordpb.EnrollRequest{Token: "t"})
			if got := status.Code(err); got != c.want {
				t.Fatalf("Enroll: %v, want %v", err, c.want)
			}
			_, err = coordpb.NewCoordinatorClient(conn).ListJobs(ctx, &coordpb.ListJobsRequest{})
			if c.want == codes.Unimplemented && status.Code(err) != codes.Unauthenticated {
				t.Fatalf("ListJobs without a certificate: %v, want Unauthenticated", err)
			}
		})
	}
}
