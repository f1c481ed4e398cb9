package kube

import (
	"errors"
	"io"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestChartTLS checks the rendered chart (make test-helm): the agent
// DaemonSet and the coordinator Deployment run with mutual TLS by
// default, their certificates a Secret mounted whole (a subPath mount
// would never see cert-manager's renewals) where --tls-dir points.
func TestChartTLS(t *testing.T) {
	dec := renderedChart(t)
	seen := map[string]bool{}
	for {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec appsv1.DeploymentSpec `json:"spec"` // a DaemonSet's template is in the same place
		}
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if obj.Kind != "Deployment" && obj.Kind != "DaemonSet" {
			continue
		}
		seen[obj.Kind] = true
		pod := obj.Spec.Template.Spec
		c := pod.Containers[0]
		if !slices.Contains(c.Args, "--tls-dir=/etc/rewind/tls") || slices.Contains(c.Args, "--insecure") {
			t.Errorf("%s %s args %v: want --tls-dir=/etc/rewind/tls and no --insecure", obj.Kind, obj.Metadata.Name, c.Args)
		}
		var mount *corev1.VolumeMount
		for i, m := range c.VolumeMounts {
			if m.MountPath == "/etc/rewind/tls" {
				mount = &c.VolumeMounts[i]
			}
		}
		if mount == nil || mount.SubPath != "" || !mount.ReadOnly {
			t.Errorf("%s %s: certificates mounted %+v: want the whole Secret, read-only, at /etc/rewind/tls", obj.Kind, obj.Metadata.Name, mount)
			continue
		}
		ok := false
		for _, v := range pod.Volumes {
			ok = ok || v.Name == mount.Name && v.Secret != nil && v.Secret.SecretName != ""
		}
		if !ok {
			t.Errorf("%s %s: volume %s is not a Secret", obj.Kind, obj.Metadata.Name, mount.Name)
		}
	}
	if !seen["Deployment"] || !seen["DaemonSet"] {
		t.Fatalf("rendered chart lacks the coordinator Deployment or the agent DaemonSet: %v", seen)
	}
}
