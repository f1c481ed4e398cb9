package kubetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// JobSetCRD is where make kube-bin copies the JobSet CRD, from the JobSet
// module (config/components/crd/bases), beside the controller.
func (b Binaries) JobSetCRD() string {
	return filepath.Join(filepath.Dir(b.JobSet), "jobset.x-k8s.io_jobsets.yaml")
}

// StartJobSet runs the real JobSet controller (sigs.k8s.io/jobset) as
// the control plane's admin until the test ends. It runs as in a
// cluster but for its webhooks: internal certificate management is off
// (it would write a Secret and patch webhook configurations that do not
// exist here) and its webhook server serves a self-signed certificate on
// loopback that the API server is never told about, so nothing defaults
// or validates JobSets: a manifest sets what the defaulting webhook would
// (completionMode, restartPolicy, network, successPolicy, startupPolicy).
// Metrics and health probes are off.
func (cp *ControlPlane) StartJobSet() *Proc {
	cp.t.Helper()
	if _, err := os.Stat(cp.bins.JobSet); err != nil {
		cp.t.Fatalf("kubetest: %v (make kube-bin builds the JobSet controller)", err)
	}
	certs := cp.path("jobset-certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		cp.t.Fatal(err)
	}
	crt, key := selfSigned(cp.t, "jobset-webhook-service.jobset-system.svc")
	writeFile(cp.t, filepath.Join(certs, "tls.crt"), crt)
	writeFile(cp.t, filepath.Join(certs, "tls.key"), key)
	_, port, _ := net.SplitHostPort(FreeAddr(cp.t))
	cfg := cp.path("jobset-config.yaml")
	writeFile(cp.t, cfg, fmt.Sprintf(`apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: %s
  certDir: %s
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: "0"
`, port, certs))
	return cp.Run("jobset-controller", cp.bins.JobSet, []string{"--config", cfg, "--kubeconfig", cp.AdminKubeconfig}, nil)
}

// selfSigned returns a PEM certificate and key for host, valid a day.
func selfSigned(t testing.TB, host string) (crt, key string) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
}
