package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"rewind.dev/rewind/internal/jobtoken"
)

func testKeys(t *testing.T) jobtoken.Keys {
	t.Helper()
	k, err := jobtoken.Parse([]byte(jobtoken.Generate()), "test")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestJobTokenSecret: with job keys, registering a managed MPIJob creates
// the Secret holding its job's token in its namespace, owned by the
// MPIJob; a registration after the key changed sets the new token in it.
// The controller only creates and patches Secrets (checkPermitted), and
// without keys makes none.
func TestJobTokenSecret(t *testing.T) {
	ann := map[string]string{AnnCheckpoint: "enabled"}
	h := newHarness(t, newMPIJob("ml", "train", 1, 1, ann), newPod("ml", "train", roleWorker, 0, "n1"),
		newMPIJob("ml", "other", 1, 1, ann))
	h.syncJob("ml/other") // no keys yet
	if sec := h.tokenSecret("ml", "other"); sec != nil {
		t.Fatalf("a token Secret without job keys: %v", sec.Name)
	}
	keys := testKeys(t)
	h.c.cfg.JobKeys = keys
	h.syncJob("ml/train")
	sec := h.tokenSecret("ml", "train")
	if sec == nil {
		t.Fatal("no token Secret for ml/train")
	}
	if got := string(sec.Data[TokenSecretKey]); got != keys.Token("ml.train") {
		t.Fatalf("token Secret holds %q, want ml.train's token", got)
	}
	if err := keys.Check("ml.other", string(sec.Data[TokenSecretKey])); err == nil {
		t.Fatal("ml/train's token is also ml.other's")
	}
	if o := sec.OwnerReferences; len(o) != 1 || o[0].Kind != "MPIJob" || o[0].Name != "train" {
		t.Fatalf("token Secret owned by %v, want the MPIJob train", o)
	}

	rotated := testKeys(t)
	h.c.cfg.JobKeys = rotated
	h.seed(h.c, newPod("ml", "train", roleWorker, 0, "n2")) // a change: registered again
	h.syncJob("ml/train")
	if got := string(h.tokenSecret("ml", "train").Data[TokenSecretKey]); got != rotated.Token("ml.train") {
		t.Fatalf("after the key changed the Secret holds %q, want the new token", got)
	}
}

// tokenSecret reads a job's token Secret from the fake's store, not
// through the API (the controller may not read Secrets), or nil.
func (h *harness) tokenSecret(ns, name string) *corev1.Secret {
	h.t.Helper()
	o, err := h.kube.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, ns, TokenSecretName(name))
	if err != nil {
		return nil
	}
	return o.(*corev1.Secret)
}
