package kubetest

import (
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestClusterPlaysKubelet checks the harness against the real control
// plane: a pod is bound and Running, a killed node turns NotReady
// through the real node lifecycle controller, which taints it, and a new
// pod goes to the live node.
func TestClusterPlaysKubelet(t *testing.T) {
	bins, ok := BinariesFromEnv()
	if !ok {
		if os.Getenv("REWIND_REQUIRE_KUBE") == "1" {
			t.Fatal("REWIND_KUBE_BIN is not set: run make test-kube")
		}
		t.Skip("no Kubernetes control plane: make test-kube builds one and runs this test")
	}
	cp := Start(t, bins)
	c := NewCluster(t, cp, nil)
	ctx := t.Context()
	n0 := c.AddNode(ctx, "n0")
	c.AddNode(ctx, "n1")
	if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "t"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the default ServiceAccount (the serviceaccount controller)", func() error {
		_, err := cp.Kube.CoreV1().ServiceAccounts("t").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "t"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	if _, err := cp.Kube.CoreV1().Pods("t").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var node string
	waitFor(t, 30*time.Second, "the pod bound and Running", func() error {
		p, err := cp.Kube.CoreV1().Pods("t").Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.NodeName == "" || p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("node %q phase %s", p.Spec.NodeName, p.Status.Phase)
		}
		node = p.Spec.NodeName
		return nil
	})
	dead := c.Node(node)
	if dead == nil {
		t.Fatalf("pod on unknown node %q", node)
	}
	_ = n0
	c.Kill(dead)
	waitFor(t, 30*time.Second, "node "+node+" NotReady and tainted by the node lifecycle controller", func() error {
		n, err := cp.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := corev1.ConditionTrue
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				ready = cond.Status
			}
		}
		if ready == corev1.ConditionTrue || len(n.Spec.Taints) == 0 {
			return fmt.Errorf("Ready=%s taints %v", ready, n.Spec.Taints)
		}
		return nil
	})
	// A new pod avoids the dead node (its taint, and no kubelet).
	pod.Name = "q"
	if _, err := cp.Kube.CoreV1().Pods("t").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the new pod Running on the live node", func() error {
		p, err := cp.Kube.CoreV1().Pods("t").Get(ctx, "q", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.NodeName == node || p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("node %q phase %s", p.Spec.NodeName, p.Status.Phase)
		}
		return nil
	})
}
