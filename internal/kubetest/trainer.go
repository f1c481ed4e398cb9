package kubetest

import (
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Kubeflow Trainer controller's fixed names (its
// cmd/trainer-controller-manager and pkg/util/cert): the namespace it
// runs in outside a pod, the Secret its certificate rotator fills and
// the directory it expects that Secret mounted at.
const (
	trainerNamespace  = "kubeflow-system"
	trainerCertSecret = "kubeflow-trainer-webhook-cert"
	trainerCertDir    = "/tmp/k8s-webhook-server/serving-certs"
)

// TrainerManifests is where make kube-bin copies the Trainer's CRDs and
// its torch-distributed ClusterTrainingRuntime, from the Trainer module
// (manifests/base), beside the controller.
func (b Binaries) TrainerManifests() string {
	return filepath.Join(filepath.Dir(b.Trainer), "trainer")
}

// StartTrainer runs the real Kubeflow Trainer v2 controller
// (github.com/kubeflow/trainer/v2) as the control plane's admin until the
// test ends; its CRDs must be applied. It runs as its Deployment does,
// its certificate rotator included: the harness creates the rotator's
// Secret (the Trainer's manifests do) and, playing the kubelet that
// mounts it into the Trainer's pod, writes it to the directory the
// rotator waits for once the rotator filled it. Its webhooks are not
// registered with the API server (their Service could not be reached
// from it), so nothing validates TrainJobs or runtimes. Its webhook
// server listens on a free port of every interface (it has no flag for
// the host); metrics, health probes and leader election are off.
func (cp *ControlPlane) StartTrainer() *Proc {
	cp.t.Helper()
	if _, err := os.Stat(cp.bins.Trainer); err != nil {
		cp.t.Fatalf("kubetest: %v (make kube-bin builds the Trainer controller)", err)
	}
	ctx := cp.t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: trainerNamespace}}
	if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		cp.t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: trainerCertSecret, Namespace: trainerNamespace}}
	if _, err := cp.Kube.CoreV1().Secrets(trainerNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		cp.t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(FreeAddr(cp.t))
	p := cp.Run("trainer-controller-manager", cp.bins.Trainer, []string{"--kubeconfig", cp.AdminKubeconfig,
		"--webhook-server-port", port, "--health-probe-bind-address", "0", "--metrics-bind-address", "0",
		"--leader-elect=false"}, nil)
	var crt, key []byte
	waitFor(cp.t, 60*time.Second, "the Trainer's certificate rotator to fill Secret "+trainerCertSecret, func() error {
		if p.Exited() {
			return fmt.Errorf("trainer-controller-manager exited: %v", p.Wait())
		}
		s, err := cp.Kube.CoreV1().Secrets(trainerNamespace).Get(ctx, trainerCertSecret, metav1.GetOptions{})
		if err != nil {
			return err
		}
		crt, key = s.Data["tls.crt"], s.Data["tls.key"]
		if len(crt) == 0 || len(key) == 0 {
			return fmt.Errorf("keys %v", slices.Sorted(maps.Keys(s.Data)))
		}
		return nil
	})
	if err := os.MkdirAll(trainerCertDir, 0o700); err != nil {
		cp.t.Fatal(err)
	}
	cp.t.Cleanup(func() { os.RemoveAll(trainerCertDir) })
	// The key first: the rotator waits for tls.crt only.
	for _, f := range []struct {
		name string
		b    []byte
	}{{"tls.key", key}, {"tls.crt", crt}} {
		if err := os.WriteFile(filepath.Join(trainerCertDir, f.name), f.b, 0o600); err != nil {
			cp.t.Fatal(err)
		}
	}
	return p
}
