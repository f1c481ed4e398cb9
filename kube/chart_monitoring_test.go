package kube

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"

	"rewind.dev/rewind/transport"
)

// chartObject is the part of a rendered object the monitoring tests read.
type chartObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Data map[string]string `json:"data"`
	Spec json.RawMessage   `json:"spec"`
}

// chartObjects decodes every object of the rendered chart in path.
func chartObjects(t *testing.T, path string) []chartObject {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []chartObject
	for {
		var o chartObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		if o.Kind != "" {
			out = append(out, o)
		}
	}
}

// TestChartMonitoringDefaults checks the chart as rendered with its
// defaults (make test-helm): the dashboard's ConfigMap is there, the
// Prometheus Operator's kinds are not (a cluster without its CRDs would
// refuse the install).
func TestChartMonitoringDefaults(t *testing.T) {
	path := os.Getenv("REWIND_CHART_RENDERED")
	if path == "" {
		t.Skip("REWIND_CHART_RENDERED not set: run make test-helm")
	}
	dashboards := 0
	for _, o := range chartObjects(t, path) {
		switch {
		case o.Kind == "PrometheusRule" || o.Kind == "ServiceMonitor":
			t.Errorf("%s %s rendered by default: it needs the Prometheus Operator's CRDs", o.Kind, o.Metadata.Name)
		case o.Kind == "ConfigMap" && o.Metadata.Labels["grafana_dashboard"] == "1":
			dashboards++
		}
	}
	if dashboards != 1 {
		t.Errorf("%d dashboard ConfigMaps labelled grafana_dashboard=1, want 1", dashboards)
	}
}

// TestChartMonitoring checks the chart rendered with every monitoring
// part on (make test-helm, $REWIND_CHART_MONITORING): the dashboard is
// JSON whose every panel has a query, the PrometheusRule's rules pass
// promtool check rules, and the ServiceMonitor's port is served by a
// Service of each daemon.
func TestChartMonitoring(t *testing.T) {
	path := os.Getenv("REWIND_CHART_MONITORING")
	if path == "" {
		t.Skip("REWIND_CHART_MONITORING not set: run make test-helm")
	}
	kinds := map[string][]chartObject{}
	for _, o := range chartObjects(t, path) {
		kinds[o.Kind] = append(kinds[o.Kind], o)
	}
	checkDashboard(t, kinds["ConfigMap"])
	if len(kinds["PrometheusRule"]) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(kinds["PrometheusRule"]))
	}
	checkRules(t, kinds["PrometheusRule"][0].Spec)
	checkServiceMonitors(t, kinds["ServiceMonitor"], kinds["Service"])
}

// checkServiceMonitors: one ServiceMonitor per daemon, each scraping a
// port a Service of that daemon serves, over mutual TLS (TLS is on by
// default) with the reader certificate's Secret, checking the daemon by
// its role's server name (transport.ServerName).
func checkServiceMonitors(t *testing.T, sms, services []chartObject) {
	t.Helper()
	if len(sms) != 2 {
		t.Fatalf("%d ServiceMonitors, want 2 (the coordinator's, the agents')", len(sms))
	}
	ports := map[string]map[string]bool{} // component -> port names its Services serve
	for _, svc := range services {
		var spec struct {
			Ports []struct{ Name string } `json:"ports"`
		}
		if err := json.Unmarshal(svc.Spec, &spec); err != nil {
			t.Fatal(err)
		}
		c := svc.Metadata.Labels["app.kubernetes.io/component"]
		if ports[c] == nil {
			ports[c] = map[string]bool{}
		}
		for _, p := range spec.Ports {
			ports[c][p.Name] = true
		}
	}
	type secretKey struct{ Name, Key string }
	roles := map[string]transport.Role{"agent": transport.RoleNode, "coordinator": transport.RoleCoordinator}
	for _, o := range sms {
		var sm struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Endpoints []struct {
				Port, Scheme string
				TLSConfig    struct {
					ServerName string `json:"serverName"`
					CA         struct{ Secret secretKey }
					Cert       struct{ Secret secretKey }
					KeySecret  secretKey `json:"keySecret"`
				} `json:"tlsConfig"`
			} `json:"endpoints"`
		}
		if err := json.Unmarshal(o.Spec, &sm); err != nil || len(sm.Endpoints) != 1 {
			t.Fatalf("ServiceMonitor %s endpoints %+v (%v): want one", o.Metadata.Name, sm.Endpoints, err)
		}
		c := sm.Selector.MatchLabels["app.kubernetes.io/component"]
		e := sm.Endpoints[0]
		if _, ok := roles[c]; !ok || !ports[c][e.Port] {
			t.Errorf("ServiceMonitor %s selects component %q, port %q: want the agent's or the coordinator's, on a port its Service serves (%v)",
				o.Metadata.Name, c, e.Port, ports)
			continue
		}
		tc := e.TLSConfig
		want := secretKey{"rewind-metrics-reader", ""}
		if e.Scheme != "https" || tc.ServerName != transport.ServerName(roles[c], "") ||
			tc.CA.Secret != (secretKey{want.Name, "ca.crt"}) || tc.Cert.Secret != (secretKey{want.Name, "tls.crt"}) ||
			tc.KeySecret != (secretKey{want.Name, "tls.key"}) {
			t.Errorf("ServiceMonitor %s: scheme %q, tlsConfig %+v: want https with the reader Secret's three keys and server name %s",
				o.Metadata.Name, e.Scheme, tc, transport.ServerName(roles[c], ""))
		}
		delete(roles, c)
	}
	if len(roles) > 0 {
		t.Errorf("no ServiceMonitor of %v", roles)
	}
}

func checkDashboard(t *testing.T, cms []chartObject) {
	t.Helper()
	for _, cm := range cms {
		if cm.Metadata.Labels["grafana_dashboard"] != "1" {
			continue
		}
		var d struct {
			UID    string `json:"uid"`
			Panels []struct {
				Type, Title string
				Targets     []struct{ Expr string }
			} `json:"panels"`
		}
		if err := json.Unmarshal([]byte(cm.Data["rewind.json"]), &d); err != nil {
			t.Fatalf("dashboard %s: %v", cm.Metadata.Name, err)
		}
		queries := 0
		for _, p := range d.Panels {
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q has an empty query", p.Title)
				}
				queries++
			}
		}
		if d.UID == "" || queries == 0 {
			t.Errorf("dashboard uid %q, %d queries", d.UID, queries)
		}
		return
	}
	t.Error("no ConfigMap labelled grafana_dashboard=1")
}

// checkRules runs promtool check rules on the PrometheusRule's spec (a
// rule file's groups). Without promtool it skips, unless
// $REWIND_REQUIRE_PROMETHEUS says the run must have it (make test-helm).
func checkRules(t *testing.T, spec json.RawMessage) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("REWIND_REQUIRE_PROMETHEUS") != "" {
			t.Fatalf("promtool not found, and REWIND_REQUIRE_PROMETHEUS is set: %v", err)
		}
		t.Skip("promtool not installed (Debian's prometheus package); make test-helm installs it")
	}
	file := filepath.Join(t.TempDir(), "rules.json") // JSON is YAML
	if err := os.WriteFile(file, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "SUCCESS: 4 rules found") {
		t.Errorf("promtool check rules: %s; want 4 rules", out)
	}
}
