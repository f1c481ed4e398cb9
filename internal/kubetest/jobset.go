package kubetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// JobSetCRD is where make kube-bin copies the JobSet CRD, from the JobSet
// module (config/components/crd/bases), beside the controller.
func (b Binaries) JobSetCRD() string {
	return filepath.Join(filepath.Dir(b.JobSet), "jobset.x-k8s.io_jobsets.yaml")
}

// JobSetWebhooks is where make kube-bin copies the JobSet controller's
// webhook configurations (config/components/webhook/manifests.yaml).
func (b Binaries) JobSetWebhooks() string {
	return filepath.Join(filepath.Dir(b.JobSet), "jobset-webhooks.yaml")
}

// StartJobSet runs the real JobSet controller (sigs.k8s.io/jobset) as
// the control plane's admin until the test ends, with its webhooks
// registered with the API server as in a cluster, so JobSets are
// defaulted and validated and their pods mutated by the JobSet
// controller itself. Where a cluster reaches the webhook server through
// a Service and a certificate its internal certificate management
// writes, here the server listens on loopback with a certificate the
// harness makes, and the webhook configurations (JobSet's own, with the
// pod webhooks' object selector its kustomization adds) call it by URL
// with that certificate as their CA. Metrics and health probes are off.
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
	addr := FreeAddr(cp.t)
	_, port, _ := net.SplitHostPort(addr)
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
	p := cp.Run("jobset-controller", cp.bins.JobSet, []string{"--config", cfg, "--kubeconfig", cp.AdminKubeconfig}, nil)
	waitFor(cp.t, 60*time.Second, "the JobSet webhook server on "+addr, func() error {
		if p.Exited() {
			return fmt.Errorf("jobset-controller exited: %v", p.Wait())
		}
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return err
		}
		return c.Close()
	})
	cp.registerJobSetWebhooks("https://"+addr, crt)
	return p
}

// registerJobSetWebhooks applies JobSet's webhook configurations with
// every webhook calling base + its path, trusting caPEM; the pod
// webhooks only for a JobSet's pods, as JobSet's kustomization patches
// them.
func (cp *ControlPlane) registerJobSetWebhooks(base, caPEM string) {
	b, err := os.ReadFile(cp.bins.JobSetWebhooks())
	if err != nil {
		cp.t.Fatalf("kubetest: %v (make kube-bin copies JobSet's webhook configurations)", err)
	}
	objs, err := Objects(b)
	if err != nil {
		cp.t.Fatal(err)
	}
	for _, o := range objs {
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		for i, h := range hooks {
			m := h.(map[string]any)
			path, _, _ := unstructured.NestedString(m, "clientConfig", "service", "path")
			if path == "" {
				cp.t.Fatalf("kubetest: %s webhook %v has no service path", o.GetName(), m["name"])
			}
			m["clientConfig"] = map[string]any{"url": base + path, "caBundle": base64.StdEncoding.EncodeToString([]byte(caPEM))}
			if strings.HasSuffix(path, "-v1-pod") {
				m["objectSelector"] = map[string]any{"matchExpressions": []any{
					map[string]any{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}}}
			}
			hooks[i] = m
		}
		if err := unstructured.SetNestedSlice(o.Object, hooks, "webhooks"); err != nil {
			cp.t.Fatal(err)
		}
		o.SetName("jobset-" + o.GetName())
	}
	a, err := NewApplier(cp.Admin)
	if err != nil {
		cp.t.Fatal(err)
	}
	if err := a.Apply(cp.t.Context(), "", objs...); err != nil {
		cp.t.Fatal(err)
	}
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
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		// Its own CA: webhook configurations trust it as their caBundle.
		IsCA:                  true,
		BasicConstraintsValid: true,
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
