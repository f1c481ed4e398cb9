package kube

import (
	"errors"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestChartTLS checks the rendered chart (make test-helm): the agent
// DaemonSet and the coordinator Deployment run with mutual TLS by
// default. The coordinator's certificate is a Secret mounted whole (a
// subPath mount would never see cert-manager's renewals) where --tls-dir
// points; the agents enroll for their own node's certificate (a
// memory-backed directory of their own, a projected token for the
// audience the coordinator reviews, the CA bundle it publishes), and no
// agent mounts a Secret with a TLS key (the job key and the gossip keys
// are the Secrets it mounts).
func TestChartTLS(t *testing.T) {
	dec := renderedChart(t)
	pods := map[string]corev1.PodSpec{}
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
		if obj.Kind == "Deployment" || obj.Kind == "DaemonSet" {
			pods[obj.Kind] = obj.Spec.Template.Spec
		}
	}
	coord, ok1 := pods["Deployment"]
	agent, ok2 := pods["DaemonSet"]
	if !ok1 || !ok2 {
		t.Fatalf("rendered chart lacks the coordinator Deployment or the agent DaemonSet: %v", slices.Collect(maps.Keys(pods)))
	}
	checkSecretTLS(t, "the coordinator", coord)
	cargs, aargs := coord.Containers[0].Args, agent.Containers[0].Args
	flag := func(args []string, name string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		return ""
	}
	for _, want := range []string{"--tls-dir=/var/run/rewind/tls", "--enroll-token=/var/run/rewind/enroll/token", "--enroll-ca=/var/run/rewind/enroll/ca.crt"} {
		if !slices.Contains(aargs, want) {
			t.Errorf("agent args %v: want %s", aargs, want)
		}
	}
	if sa := flag(cargs, "enroll-service-account"); !strings.HasSuffix(sa, "/"+agent.ServiceAccountName) || flag(cargs, "enroll-ca") == "" {
		t.Errorf("coordinator enrolls %q with CA %q; the agents run as %q", sa, flag(cargs, "enroll-ca"), agent.ServiceAccountName)
	}
	for _, v := range agent.Volumes {
		switch {
		case v.Name == "tls" && (v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory):
			t.Errorf("agent TLS directory %+v: want a memory-backed emptyDir", v.VolumeSource)
		case v.Secret != nil && v.Name != "job-key" && v.Name != "gossip-keys":
			t.Errorf("agent mounts Secret %s: with enrollment it mounts no TLS key but its own", v.Secret.SecretName)
		case v.Name == "enroll":
			var aud, cm string
			for _, src := range v.Projected.Sources {
				if src.ServiceAccountToken != nil {
					aud = src.ServiceAccountToken.Audience
				}
				if src.ConfigMap != nil {
					cm = src.ConfigMap.Name
				}
			}
			if aud != flag(cargs, "enroll-audience") || cm != flag(cargs, "enroll-ca-configmap") || aud == "" || cm == "" {
				t.Errorf("agent's token for %q and bundle %q; the coordinator reviews %q and publishes %q",
					aud, cm, flag(cargs, "enroll-audience"), flag(cargs, "enroll-ca-configmap"))
			}
		}
	}
}

// checkSecretTLS checks a pod that mounts its certificate from a Secret.
func checkSecretTLS(t *testing.T, who string, pod corev1.PodSpec) {
	t.Helper()
	c := pod.Containers[0]
	if !slices.Contains(c.Args, "--tls-dir=/etc/rewind/tls") || slices.Contains(c.Args, "--insecure") {
		t.Errorf("%s args %v: want --tls-dir=/etc/rewind/tls and no --insecure", who, c.Args)
	}
	var mount *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if m.MountPath == "/etc/rewind/tls" {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil || mount.SubPath != "" || !mount.ReadOnly {
		t.Errorf("%s: certificates mounted %+v: want the whole Secret, read-only, at /etc/rewind/tls", who, mount)
		return
	}
	ok := false
	for _, v := range pod.Volumes {
		ok = ok || v.Name == mount.Name && v.Secret != nil && v.Secret.SecretName != ""
	}
	if !ok {
		t.Errorf("%s: volume %s is not a Secret", who, mount.Name)
	}
}
