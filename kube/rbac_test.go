package kube

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// TestChartRBAC checks the chart as rendered by `make test-helm` (the file
// named by $REWIND_CHART_RENDERED): its ClusterRole and Role grant exactly
// Permissions, the calls this package makes, nothing more and nothing
// missing.
func TestChartRBAC(t *testing.T) {
	dec := renderedChart(t)
	got := map[string][]string{} // "cluster|namespaced group/resource" → verbs
	for {
		var r struct {
			Kind  string              `json:"kind"`
			Rules []rbacv1.PolicyRule `json:"rules"`
		}
		if err := dec.Decode(&r); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if r.Kind != "ClusterRole" && r.Kind != "Role" {
			continue
		}
		for _, rule := range r.Rules {
			if len(rule.NonResourceURLs)+len(rule.ResourceNames) > 0 {
				t.Errorf("%s rule %v: unexpected nonResourceURLs or resourceNames", r.Kind, rule)
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					k := r.Kind + " " + g + "/" + res
					got[k] = append(got[k], rule.Verbs...)
				}
			}
		}
	}
	want := map[string][]string{}
	for _, p := range Permissions {
		kind := "ClusterRole"
		if p.Namespaced {
			kind = "Role"
		}
		want[kind+" "+p.Group+"/"+p.Resource] = p.Verbs
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		g, w := slices.Sorted(slices.Values(got[k])), slices.Sorted(slices.Values(want[k]))
		if !slices.Equal(g, w) {
			t.Errorf("%s: chart grants %s, the controller calls %s", k, strings.Join(g, ","), strings.Join(w, ","))
		}
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			t.Errorf("%s: the controller calls %v, the chart grants nothing", k, want[k])
		}
	}
}

// TestChartCoordinatorReadiness checks the rendered chart (make test-helm):
// the coordinator is ready only while it leads (/readyz on its metrics
// port), so that its Service routes to the leader alone.
func TestChartCoordinatorReadiness(t *testing.T) {
	dec := renderedChart(t)
	for {
		var d appsv1.Deployment
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if d.Kind != "Deployment" || !strings.HasSuffix(d.Name, "-coordinator") {
			continue
		}
		c := d.Spec.Template.Spec.Containers[0]
		p := c.ReadinessProbe
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.String() != "metrics" ||
			p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Fatalf("coordinator readiness probe %+v: want httpGet /readyz on the metrics port, HTTPS (TLS is on by default)", p)
		}
		if !slices.Contains(c.Args, "--kube") {
			t.Fatalf("coordinator args %v: without --kube there is no election and /readyz is always ready", c.Args)
		}
		return
	}
	t.Fatal("no coordinator Deployment in the rendered chart")
}

// renderedChart decodes the chart `make test-helm` rendered into the file
// named by $REWIND_CHART_RENDERED; without it the test is skipped.
func renderedChart(t *testing.T) *yaml.YAMLOrJSONDecoder {
	t.Helper()
	path := os.Getenv("REWIND_CHART_RENDERED")
	if path == "" {
		t.Skip("REWIND_CHART_RENDERED not set: run make test-helm")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
}
