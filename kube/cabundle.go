package kube

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"rewind.dev/rewind/internal/clock"
)

// CABundle is the ConfigMap in which the coordinator publishes the CA
// it enrolls nodes with (key ca.crt): what agents check the coordinator's
// certificate against on their first enrollment, before they hold any
// file of the cluster's. A ConfigMap, not a Secret: it holds no key, and
// every node may read it.
type CABundle struct {
	Namespace, Name string
	PEM             []byte
}

// CABundleKey is the key of the certificate in the ConfigMap.
const CABundleKey = "ca.crt"

// publishCABundle creates or updates the ConfigMap until it holds b.PEM,
// trying again every few seconds until ctx ends.
func publishCABundle(ctx context.Context, client kubernetes.Interface, b CABundle, log *slog.Logger) {
	for {
		err := putCABundle(ctx, client, b)
		if err == nil {
			log.Info("kube: CA bundle published for enrollment", "configmap", b.Namespace+"/"+b.Name)
			return
		}
		log.Error("kube: publishing the CA bundle agents enroll with; trying again", "configmap", b.Namespace+"/"+b.Name, "err", err)
		if clock.Sleep(ctx, 5*time.Second) != nil {
			return
		}
	}
}

func putCABundle(ctx context.Context, client kubernetes.Interface, b CABundle) error {
	cms := client.CoreV1().ConfigMaps(b.Namespace)
	want := string(b.PEM)
	cm, err := cms.Get(ctx, b.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: b.Name, Namespace: b.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "rewind"}}, Data: map[string]string{CABundleKey: want}}, metav1.CreateOptions{})
		return err
	case err != nil:
		return err
	case bytes.Equal([]byte(cm.Data[CABundleKey]), b.PEM):
		return nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[CABundleKey] = want
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating: %w", err)
	}
	return nil
}
