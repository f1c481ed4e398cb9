package transport

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// A CA issues the certificates of a cluster that has no PKI of its own
// (rewind certs, the demo, the tests). A cluster with cert-manager or a
// SPIFFE issuer uses those instead; only the files' layout matters.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte // Cert, PEM-encoded: what ca.crt holds
}

// CA files in a CA directory: the certificate, and its key (0600).
const CAKeyFile = "ca.key"

// NewCA makes a self-signed certificate authority named name, valid for
// validity from now.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"rewind"}},
		NotBefore:             now.Add(-time.Hour), // a peer's clock a little behind still accepts it
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// LoadCA reads a CA from dir: ca.crt and ca.key as WriteCA writes them,
// or else tls.crt and tls.key, the layout of a cert-manager CA Secret.
// The key is ECDSA, in SEC 1 or PKCS #8 form.
func LoadCA(dir string) (*CA, error) {
	certFile, keyFile := CAFile, CAKeyFile
	if _, err := os.Stat(filepath.Join(dir, CAKeyFile)); errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(dir, KeyFile)); err == nil {
			certFile, keyFile = CertFile, KeyFile
		}
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, certFile))
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, keyFile))
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("transport: %s: %s or %s is not PEM", dir, certFile, keyFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("transport: %s: %w", dir, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("transport: %s: %s is not a CA certificate", dir, certFile)
	}
	key, err := parseECKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("transport: %s: %s: %w", dir, keyFile, err)
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(cb)}, nil
}

// parseECKey parses an ECDSA private key in SEC 1 or PKCS #8 form.
func parseECKey(der []byte) (*ecdsa.PrivateKey, error) {
	if k, err := x509.ParseECPrivateKey(der); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, errors.New("not an ECDSA key in SEC 1 or PKCS #8 form")
	}
	ec, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T key: rewind's CA signs with ECDSA", k)
	}
	return ec, nil
}

// WriteCA writes the CA's certificate and key (owner-only) into dir.
func (ca *CA) WriteCA(dir string) error {
	der, err := x509.MarshalECPrivateKey(ca.Key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, CAKeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, CAFile), ca.PEM, 0o644)
}

// Leaf asks for a certificate.
type Leaf struct {
	Identity    Identity
	TrustDomain string // empty: DefaultTrustDomain
	// DNSNames and IPs are extra SANs, for tools that check host names
	// (grpcurl, a load balancer); rewind itself checks the identity. A
	// node's or coordinator's certificate names ServerName first.
	DNSNames []string
	IPs      []net.IP
	// Validity from now; NotBefore and NotAfter, when set, override it
	// (a test's expired certificate).
	Validity            time.Duration
	NotBefore, NotAfter time.Time
}

// Issue signs a new key's certificate for leaf and returns both,
// PEM-encoded. Nodes and the coordinator both serve and dial; operators
// and readers only dial.
func (ca *CA) Issue(leaf Leaf) (certPEM, keyPEM []byte, err error) {
	if err := leaf.Identity.Validate(); err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if certPEM, err = ca.sign(&key.PublicKey, leaf); err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// sign signs pub's certificate for leaf (its identity valid), PEM-encoded.
func (ca *CA) sign(pub any, leaf Leaf) ([]byte, error) {
	td := leaf.TrustDomain
	if td == "" {
		td = DefaultTrustDomain
	}
	nb, na := leaf.NotBefore, leaf.NotAfter
	if nb.IsZero() {
		nb = time.Now().Add(-time.Hour)
	}
	if na.IsZero() {
		na = time.Now().Add(leaf.Validity)
	}
	if na.After(ca.Cert.NotAfter) { // a leaf outliving its CA would be refused from then on anyway
		na = ca.Cert.NotAfter
	}
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	dns := leaf.DNSNames
	if r := leaf.Identity.Role; r == RoleNode || r == RoleCoordinator {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
		dns = append([]string{ServerName(r, td)}, dns...)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: leaf.Identity.Name, OrganizationalUnit: []string{leaf.Identity.Role.String()}, Organization: []string{"rewind"}},
		NotBefore:    nb,
		NotAfter:     na,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		URIs:         []*url.URL{leaf.Identity.URI(td)},
		DNSNames:     dns,
		IPAddresses:  leaf.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// IssueDir issues leaf's certificate into dir, with the CA's certificate
// as ca.crt (WriteDir).
func (ca *CA) IssueDir(dir string, leaf Leaf) error {
	certPEM, keyPEM, err := ca.Issue(leaf)
	if err != nil {
		return err
	}
	return WriteDir(dir, certPEM, keyPEM, ca.PEM)
}

// WriteDir writes a certificate directory: each file to a temporary name
// and then renamed over the old one, the trusted authorities first and
// the certificate last, so that a process reading the directory sees
// each file whole. A reader that catches the new key beside the old
// certificate keeps what it had and reads again at its next handshake.
func WriteDir(dir string, certPEM, keyPEM, caPEM []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		b    []byte
		mode os.FileMode
	}{{CAFile, caPEM, 0o644}, {KeyFile, keyPEM, 0o600}, {CertFile, certPEM, 0o644}} {
		if err := writeFile(filepath.Join(dir, f.name), f.b, f.mode); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(errors.New("transport: no randomness for a serial number"))
	}
	return n
}
