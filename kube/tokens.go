package kube

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// TokenSecretKey is the key of the job's token in its token Secret.
const TokenSecretKey = "token"

// TokenSecretName is the Secret in a managed job's namespace that holds
// its job token (Config.JobKeys), for its pods to mount and point
// REWIND_JOB_TOKEN_FILE at.
func TokenSecretName(name string) string { return name + "-rewind-token" }

// ensureToken creates the Secret holding job id's token in the
// workload's namespace, owned by the workload so that it goes with it,
// or sets the token in it where it exists (a key rotated). Without job
// keys it does nothing. The controller neither reads nor lists Secrets:
// it may create and patch them, no more.
func (c *Controller) ensureToken(ctx context.Context, u *unstructured.Unstructured, id string) error {
	if !c.cfg.JobKeys.Enabled() {
		return nil
	}
	ns, name := u.GetNamespace(), TokenSecretName(u.GetName())
	token := c.cfg.JobKeys.Token(id)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "rewind"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Name: u.GetName(), UID: u.GetUID(),
			}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{TokenSecretKey: []byte(token)},
	}
	_, err := c.kube.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		patch, _ := json.Marshal(map[string]any{"data": map[string][]byte{TokenSecretKey: []byte(token)}})
		_, err = c.kube.CoreV1().Secrets(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		return fmt.Errorf("kube: the token Secret %s/%s of job %s: %w", ns, name, id, err)
	}
	return nil
}
