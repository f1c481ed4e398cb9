package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/enroll"
	"rewind.dev/rewind/internal/kubetest"
	"rewind.dev/rewind/kube"
	"rewind.dev/rewind/transport"
)

// TestNodeEnrollment: per-node certificates in Kubernetes, against the
// real API server. The coordinator runs with the chart's ServiceAccount
// and RBAC, mutual TLS and --enroll-ca; it publishes the CA bundle in the
// chart's ConfigMap. An agent process with no certificate, given a
// projected token of the chart's agent ServiceAccount bound to a pod on
// its node (TokenRequest, as the kubelet makes one), enrolls, registers
// over mutual TLS as that node, and can speak for no other. Tokens that
// prove another node, no node, another account or another audience are
// refused by the coordinator after the API server's review.
func TestNodeEnrollment(t *testing.T) {
	e := setup(t)
	pki := filepath.Join(e.dir, "pki")
	ca, err := transport.NewCA("rewind e2e CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteCA(filepath.Join(pki, "ca")); err != nil {
		t.Fatal(err)
	}
	for dir, id := range map[string]transport.Identity{"coordinator": {Role: transport.RoleCoordinator, Name: "coordinator"},
		"operator": {Role: transport.RoleOperator, Name: "e2e"}} {
		if err := ca.IssueDir(filepath.Join(pki, dir), transport.Leaf{Identity: id, Validity: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	c := e.runCoordinator("enroller", nil, "--tls-dir", filepath.Join(pki, "coordinator"),
		"--enroll-ca", filepath.Join(pki, "ca"), "--enroll-service-account", "rewind/rewind-agent",
		"--enroll-audience", "rewind", "--enroll-ca-configmap", "rewind-ca-bundle")
	op, err := transport.Load(filepath.Join(pki, "operator"), nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := op.NewClient(c.addr, transport.ExpectCoordinator)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	api := coordpb.NewCoordinatorClient(conn)

	// The leader publishes the CA bundle, with the chart's Role.
	bundle := filepath.Join(e.dir, "ca-bundle.crt")
	e.eventually(60*time.Second, "the CA bundle ConfigMap rewind/rewind-ca-bundle", func() error {
		cm, err := e.cp.Kube.CoreV1().ConfigMaps("rewind").Get(e.ctx, "rewind-ca-bundle", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data[kube.CABundleKey] != string(ca.PEM) {
			return fmt.Errorf("it holds %q", cm.Data[kube.CABundleKey])
		}
		return os.WriteFile(bundle, []byte(cm.Data[kube.CABundleKey]), 0o644)
	})

	e.cluster.AddNode(e.ctx, "gpu-1")
	e.cluster.AddNode(e.ctx, "gpu-2")
	tok1 := e.agentToken(t, "gpu-1", "rewind", true)

	// The agent enrolls, then registers as gpu-1 over mutual TLS.
	dir := filepath.Join(e.dir, "agent-gpu-1")
	tlsDir := filepath.Join(dir, "tls")
	listen := kubetest.FreeAddr(t)
	agent := kubetest.RunProc(t, e.dir, "agent-gpu-1", e.rewind, []string{"agent", "--node", "gpu-1",
		"--shm-root", filepath.Join(e.shmBase, "gpu-1"), "--socket", filepath.Join(dir, "agent.sock"),
		"--listen", listen, "--advertise", listen, "--metrics", "", "--coordinator", c.addr, "--gossip", "",
		"--tls-dir", tlsDir, "--enroll-token", tok1, "--enroll-ca", bundle}, nil)
	e.eventually(60*time.Second, "gpu-1 to enroll and register", func() error {
		if agent.Exited() {
			t.Fatalf("the agent exited: %v (log %s)", agent.Wait(), agent.Log)
		}
		resp, err := api.Nodes(e.ctx, &coordpb.NodesRequest{Names: []string{"gpu-1"}})
		if err == nil && len(resp.Nodes) == 0 {
			err = fmt.Errorf("not registered")
		}
		return err
	})
	sec, err := transport.Load(tlsDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if id := sec.Identity(); id != (transport.Identity{Role: transport.RoleNode, Name: "gpu-1"}) {
		t.Fatalf("the agent's certificate names %v, want node/gpu-1", id)
	}
	// Its certificate speaks for gpu-1 only.
	nconn, err := sec.NewClient(c.addr, transport.ExpectCoordinator)
	if err != nil {
		t.Fatal(err)
	}
	defer nconn.Close()
	_, err = coordpb.NewCoordinatorClient(nconn).Report(e.ctx, &coordpb.ReportRequest{Node: "gpu-2"})
	if err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Fatalf("gpu-1's certificate reporting for gpu-2: %v, want PermissionDenied", err)
	}

	// What the API server's review refuses.
	coordTok, err := e.cp.Kube.CoreV1().ServiceAccounts("rewind").CreateToken(e.ctx, "rewind-coordinator", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"rewind"}, ExpirationSeconds: ptr.To(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	refused := map[string]struct{ token, says string }{
		"a token bound to a pod on another node": {e.agentToken(t, "gpu-2", "rewind", true), "proves node gpu-2, not gpu-1"},
		"a token bound to no pod":                {e.agentToken(t, "", "rewind", false), "bound to no pod"},
		"a token for another audience":           {e.agentToken(t, "gpu-1", "https://kubernetes.default.svc", true), "proves no node"},
		"another service account's token":        {writeToken(t, e.dir, "coordinator", coordTok.Status.Token), "not the agents' service account"},
	}
	for name, r := range refused {
		t.Run(name, func(t *testing.T) {
			cfg := enroll.Config{Dir: filepath.Join(t.TempDir(), "tls"), Node: "gpu-1", Coordinator: c.addr, CAFile: bundle, TokenFile: r.token}
			ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
			defer cancel()
			if _, err := cfg.Once(ctx); err == nil || !strings.Contains(err.Error(), r.says) {
				t.Fatalf("enrollment = %v, want refused: %q", err, r.says)
			}
		})
	}
	audit, err := api.Audit(e.ctx, &coordpb.AuditRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var enrolled, refusedSeen int
	for _, a := range audit.Entries {
		if strings.HasSuffix(a.Method, "/Enroll") {
			if a.Code == 0 {
				enrolled++
			} else {
				refusedSeen++
			}
		}
	}
	if enrolled < 1 || refusedSeen < len(refused) {
		t.Fatalf("audit log: %d enrollments, %d refused; want at least 1 and %d", enrolled, refusedSeen, len(refused))
	}
}

// agentToken returns the path of a token of the chart's agent
// ServiceAccount for audience, as the kubelet projects one: bound to a
// pod on node (when bound), made here for it.
func (e *env) agentToken(t *testing.T, node, audience string, bound bool) string {
	t.Helper()
	spec := authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: ptr.To(int64(600))}
	if bound {
		pod, err := e.cp.Kube.CoreV1().Pods("rewind").Create(e.ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "rewind-agent-", Namespace: "rewind"},
			Spec: corev1.PodSpec{ServiceAccountName: "rewind-agent", NodeName: node, AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "agent", Image: "rewind"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tok, err := e.cp.Kube.CoreV1().ServiceAccounts("rewind").CreateToken(e.ctx, "rewind-agent", &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of rewind/rewind-agent: %v", err)
	}
	return writeToken(t, e.dir, fmt.Sprintf("agent-%s-%s-%v", node, strings.NewReplacer(":", "_", "/", "_").Replace(audience), bound), tok.Status.Token)
}

func writeToken(t *testing.T, dir, name, token string) string {
	t.Helper()
	path := filepath.Join(dir, name+".token")
	if err := os.WriteFile(path, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
