// Package kubetest runs a real Kubernetes control plane on loopback for
// end-to-end tests: etcd, kube-apiserver (RBAC on, service-account
// tokens), kube-controller-manager (the Job, garbage-collector, node
// lifecycle and service-account controllers) and, on request,
// mpi-operator. Nothing can run a kubelet or a scheduler here: Cluster
// plays both (kubelet.go), binding pods to the Node objects it creates,
// renewing their leases, and running the containers' processes.
//
// The binaries come from `make kube-bin` (bin/): kube-apiserver and
// kube-controller-manager built from the Go module proxy through the
// wrapper module in kubebin/ with mpi-operator, the JobSet and Trainer
// controllers through jobsetbin/, etcd from Debian.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"rewind.dev/rewind/internal/freeport"
)

// Binaries are the programs a control plane runs.
type Binaries struct {
	Etcd, APIServer, ControllerManager, MPIOperator, JobSet, Trainer string
}

// BinariesFromEnv finds the binaries in $REWIND_KUBE_BIN (make test-kube
// sets it to bin/; etcd from $PATH when not there). ok is false when the
// variable is unset.
func BinariesFromEnv() (b Binaries, ok bool) {
	dir := os.Getenv("REWIND_KUBE_BIN")
	if dir == "" {
		return b, false
	}
	b = Binaries{
		APIServer:         filepath.Join(dir, "kube-apiserver"),
		ControllerManager: filepath.Join(dir, "kube-controller-manager"),
		MPIOperator:       filepath.Join(dir, "mpi-operator"),
		JobSet:            filepath.Join(dir, "jobset-controller"),
		Trainer:           filepath.Join(dir, "trainer-controller-manager"),
		Etcd:              filepath.Join(dir, "etcd"),
	}
	if _, err := os.Stat(b.Etcd); err != nil {
		if p, err := exec.LookPath("etcd"); err == nil {
			b.Etcd = p
		}
	}
	return b, true
}

// ControlPlane is a running etcd, kube-apiserver and
// kube-controller-manager.
type ControlPlane struct {
	Dir   string // logs, certificates, kubeconfigs
	URL   string // the API server, https://127.0.0.1:PORT
	Admin *rest.Config
	// AdminKubeconfig is a kubeconfig file for Admin (for processes).
	AdminKubeconfig string
	Kube            kubernetes.Interface
	Dyn             dynamic.Interface
	// Warnings collects every warning the API server sent to Admin's
	// clients (deprecated APIs, unknown fields).
	Warnings *WarningLog

	t     testing.TB
	bins  Binaries
	caPEM []byte
}

// NodeMonitorGrace is how long kube-controller-manager waits for a
// silent node before it sets the Node's Ready condition Unknown (40 s
// or 50 s in a real cluster; short here so a node's death shows in the
// test's time).
const NodeMonitorGrace = 4 * time.Second

// Start starts the control plane; t.Cleanup stops it. Its logs are in
// Dir and printed (the last lines) when the test failed.
func Start(t testing.TB, bins Binaries) *ControlPlane {
	t.Helper()
	for _, b := range []string{bins.Etcd, bins.APIServer, bins.ControllerManager} {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("kubetest: %v (make kube-bin builds the control plane)", err)
		}
	}
	cp := &ControlPlane{Dir: t.TempDir(), t: t, bins: bins, Warnings: &WarningLog{}}
	etcd := cp.startEtcd()
	cp.startAPIServer(etcd)
	cp.startControllerManager()
	return cp
}

func (cp *ControlPlane) path(name string) string { return filepath.Join(cp.Dir, name) }

func (cp *ControlPlane) startEtcd() string {
	client, peer := FreeAddr(cp.t), FreeAddr(cp.t)
	cp.Run("etcd", cp.bins.Etcd, []string{"--name", "e2e", "--data-dir", cp.path("etcd"),
		"--listen-client-urls", "http://" + client, "--advertise-client-urls", "http://" + client,
		"--listen-peer-urls", "http://" + peer, "--initial-advertise-peer-urls", "http://" + peer,
		"--initial-cluster", "e2e=http://" + peer, "--log-level", "warn"}, nil)
	waitFor(cp.t, 30*time.Second, "etcd to answer on "+client, func() error {
		resp, err := http.Get("http://" + client + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	})
	return "http://" + client
}

// adminToken is the static token of the cluster's administrator (group
// system:masters), the identity of the harness and of the controllers
// that are not under test.
func (cp *ControlPlane) startAPIServer(etcd string) {
	tok := randHex(cp.t)
	writeFile(cp.t, cp.path("tokens.csv"), tok+",admin,admin,system:masters\n")
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		cp.t.Fatal(err)
	}
	writeFile(cp.t, cp.path("sa.key"), string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})))
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		cp.t.Fatal(err)
	}
	writeFile(cp.t, cp.path("sa.pub"), string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})))
	addr := FreeAddr(cp.t)
	_, port, _ := net.SplitHostPort(addr)
	cp.Run("kube-apiserver", cp.bins.APIServer, []string{
		"--etcd-servers", etcd, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", port, "--cert-dir", cp.path("certs"),
		"--authorization-mode", "Node,RBAC", "--token-auth-file", cp.path("tokens.csv"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", cp.path("sa.pub"), "--service-account-signing-key-file", cp.path("sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/24", "--endpoint-reconciler-type", "none",
	}, nil)
	cp.URL = "https://" + addr
	crt := cp.path("certs/apiserver.crt")
	waitFor(cp.t, 60*time.Second, "kube-apiserver's certificate", func() error {
		b, err := os.ReadFile(crt)
		if err == nil {
			cp.caPEM = b
		}
		return err
	})
	cp.Admin = &rest.Config{Host: cp.URL, BearerToken: tok, TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM},
		QPS: 100, Burst: 200, WarningHandler: cp.Warnings}
	cp.AdminKubeconfig = cp.WriteKubeconfig("admin", tok)
	waitFor(cp.t, 90*time.Second, "kube-apiserver to be ready", func() error {
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} // only a readiness probe
		req, _ := http.NewRequest(http.MethodGet, cp.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
	var err2 error
	if cp.Kube, err2 = kubernetes.NewForConfig(cp.Admin); err2 != nil {
		cp.t.Fatal(err2)
	}
	if cp.Dyn, err2 = dynamic.NewForConfig(cp.Admin); err2 != nil {
		cp.t.Fatal(err2)
	}
}

func (cp *ControlPlane) startControllerManager() {
	cp.Run("kube-controller-manager", cp.bins.ControllerManager, []string{
		"--kubeconfig", cp.AdminKubeconfig, "--leader-elect=false", "--secure-port", "0",
		"--controllers", "job-controller,garbage-collector-controller,node-lifecycle-controller,serviceaccount-controller,taint-eviction-controller",
		"--node-monitor-period", "1s", "--node-monitor-grace-period", NodeMonitorGrace.String(),
		"--service-account-private-key-file", cp.path("sa.key"), "--root-ca-file", cp.path("certs/apiserver.crt"),
		"--concurrent-job-syncs", "2",
	}, nil)
}

// WriteKubeconfig writes a kubeconfig for the API server with a bearer
// token and returns its path.
func (cp *ControlPlane) WriteKubeconfig(name, token string) string {
	p := cp.path(name + ".kubeconfig")
	ca := cp.path("ca.crt")
	writeFile(cp.t, ca, string(cp.caPEM))
	writeFile(cp.t, p, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {token: %q}
contexts:
- name: e2e
  context: {cluster: e2e, user: %s}
current-context: e2e
`, cp.URL, ca, name, token, name))
	return p
}

// Config returns a rest.Config for token (a ServiceAccount's).
func (cp *ControlPlane) Config(token string, warnings *WarningLog) *rest.Config {
	return &rest.Config{Host: cp.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM},
		QPS: 100, Burst: 200, WarningHandler: warnings}
}

// Proc is a process the harness started.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  string
	done chan struct{}
	err  error
}

// Exited reports whether the process ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits for the process to end and returns how.
func (p *Proc) Wait() error { <-p.done; return p.err }

// Kill kills the process and its group at once (SIGKILL) and waits.
func (p *Proc) Kill() {
	if p.Cmd.Process != nil {
		_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
}

// Run starts a process in its own process group, its output in
// Dir/NAME.log; the test's cleanup kills it. env is added to the
// harness's environment.
func (cp *ControlPlane) Run(name, bin string, args, env []string) *Proc {
	return RunProc(cp.t, cp.Dir, name, bin, args, env)
}

// RunProc is ControlPlane.Run for any directory.
func RunProc(t testing.TB, dir, name, bin string, args, env []string) *Proc {
	t.Helper()
	log := filepath.Join(dir, strings.ReplaceAll(name, "/", "_")+".log")
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("kubetest: starting %s: %v", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, Log: log, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("--- the last lines of %s (%s):\n%s", name, log, tail(log, 25))
		}
	})
	return p
}

// FreeAddr returns a loopback address with a port free now.
func FreeAddr(t testing.TB) string {
	a, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// waitFor polls check until it succeeds or timeout passes (then the test
// fails naming what it waited for and the last error).
func waitFor(t testing.TB, timeout time.Duration, what string, check func() error) {
	t.Helper()
	if err := Poll(context.Background(), timeout, check); err != nil {
		t.Fatalf("kubetest: waiting for %s: %v", what, err)
	}
}

// Poll calls check every 100 ms until it returns nil, ctx ends or
// timeout passes; it returns check's last error then. It is wait.Until
// with a context and a slower beat: each check here is a call to the API
// server, and several wait at once on two cores.
func Poll(ctx context.Context, timeout time.Duration, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %v: %w", timeout, err)
		case <-tick.C:
		}
	}
}

func writeFile(t testing.TB, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func randHex(t testing.TB) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WarningLog collects the API server's warnings (rest.WarningHandler).
type WarningLog struct {
	mu   sync.Mutex
	list []string
}

// HandleWarningHeader records one warning.
func (w *WarningLog) HandleWarningHeader(code int, agent, text string) {
	if code != 299 || text == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

// Take returns the warnings so far and forgets them.
func (w *WarningLog) Take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.list
	w.list = nil
	return l
}
