package coordinator_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"text/template"
	"time"

	"k8s.io/apimachinery/pkg/util/yaml"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
	"rewind.dev/rewind/transport"
)

// The chart's dashboard and alert rules, tested against a real
// Prometheus scraping a real local cluster.
const (
	chartDir      = "../deploy/helm/rewind"
	dashboardFile = chartDir + "/files/dashboard.json"
	alertsFile    = chartDir + "/files/alerts.yaml"
)

// TestDashboardAndAlertsAgainstPrometheus runs a coordinator and three
// agents with NVMe and shared-filesystem tiers and their metrics on
// loopback, a real Prometheus (Debian's package) scraping them every
// second and evaluating the chart's alert rules, saves steps of a job,
// loses a node and lets the job re-gang, saves on; then it queries
// every panel of the chart's dashboard until each returns a number,
// checks that Prometheus loaded every alert rule and evaluated it
// without error, and that the alerts whose thresholds (lowered here) the
// cluster crossed fire, naming their job or node. Without a prometheus binary it skips, unless
// REWIND_REQUIRE_PROMETHEUS is set (make test).
func TestDashboardAndAlertsAgainstPrometheus(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("REWIND_REQUIRE_PROMETHEUS") != "" {
			t.Fatalf("prometheus not found, and REWIND_REQUIRE_PROMETHEUS is set: %v", err)
		}
		t.Skip("prometheus not installed (Debian's prometheus package; make prometheus installs it)")
	}
	const job, ws = "dash", 2
	cl, targets := monitoredCluster(t)
	// Thresholds this cluster crosses, so that the alerts fire: any age
	// of a shared tier's copy, any use of a budget, one recovery.
	prom := startPrometheus(t, bin, targets, renderAlerts(t, map[string]any{
		"for": "0s", "recoveryPointAgeSeconds": 0, "budgetUsedRatio": 0, "recoveriesPerHour": 1}))

	cl.saveSteps(job, ws, 3, 0, 1)
	waitReplicas(t, cl, job, 3, ws, 2)
	// A counter's first sample is its start: increase() counts the
	// recovery only if Prometheus saw the job's count at 0 before.
	wait.For(t, time.Minute, "prometheus to scrape the job's recoveries at 0", func() bool {
		return prom.hasNumber(t, `rewind_job_recoveries_total{job_id="dash",result="ok"} == 0`)
	})
	events := cl.watch(job)
	cl.agents[1].Stop() // node-1 dies with its memory
	if _, err := cl.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-1", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, events); !ev.Ok || ev.Placement[1] != "node-2" {
		t.Fatalf("recovery event: %v", ev)
	}
	// The new gang, rank 0 on node-0 and rank 1 on node-2, restores
	// step 3 as restarted ranks do, and saves on.
	for rank, node := range map[uint32]int{0: 0, 1: 2} {
		s, err := cl.clients[node].Session(job, rank, ws)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.RestoreStep(ctxT(t), 3); err != nil {
			t.Fatalf("rank %d restores step 3 on node-%d: %v", rank, node, err)
		}
		s.Close()
	}
	step := int64(3)
	saveOn := func() {
		step++
		for rank, node := range map[uint32]int{0: 0, 1: 2} {
			s, err := cl.clients[node].Session(job, rank, ws)
			if err != nil {
				t.Fatal(err)
			}
			data := rankData(step, rank)
			if err := s.Save(ctxT(t), step, []sdk.Tensor{{Name: "w", DType: shm.U8, Shape: []int64{int64(len(data))}, Data: data}}, nil); err != nil {
				t.Fatalf("save of step %d, rank %d: %v", step, rank, err)
			}
			s.Close()
		}
		cl.waitLatest(job, step)
	}
	saveOn()

	panels := dashboardQueries(t)
	// Rates and quantiles need saves within their window: the job goes
	// on saving until every panel has a number.
	wait.ForNil(t, 2*time.Minute, "every dashboard panel returns a number", func() error {
		saveOn()
		var missing []string
		for _, p := range panels {
			if !prom.hasNumber(t, p.expr) {
				missing = append(missing, fmt.Sprintf("%q: %s", p.title, p.expr))
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%d of %d queries without data: %s", len(missing), len(panels), strings.Join(missing, "; "))
		}
		return nil
	})
	wait.ForNil(t, time.Minute, "every alert rule loaded and evaluated without error", prom.rulesHealthy)
	wait.ForNil(t, time.Minute, "the alerts whose thresholds the cluster crossed fire", func() error {
		return prom.firing(t, map[string]map[string]string{
			"RewindTierDegraded":        {"node": "node-2", "tier": "nvme"},
			"RewindRecoveryPointOld":    {"job_id": job},
			"RewindShmBudgetNearlyFull": {"node": "node-0"},
			"RewindRepeatedRecoveries":  {"job_id": job},
		})
	})
}

// firing checks that each alert named in want fires with the labels
// given.
func (p *promServer) firing(t *testing.T, want map[string]map[string]string) error {
	var data struct {
		Alerts []struct {
			Labels map[string]string
			State  string
		}
	}
	p.get(t, "/api/v1/alerts", &data)
	for name, labels := range want {
		found := false
		for _, a := range data.Alerts {
			match := a.Labels["alertname"] == name && a.State == "firing"
			for k, v := range labels {
				match = match && a.Labels[k] == v
			}
			found = found || match
		}
		if !found {
			return fmt.Errorf("%s%v does not fire; alerts: %+v", name, labels, data.Alerts)
		}
	}
	return nil
}

// monitoredCluster starts a coordinator (one replica per shard, a copy
// of every step on NVMe and every other on the shared filesystem) and
// three agents, all serving metrics on loopback, node-2's NVMe failing
// every write; it returns the cluster and the metrics addresses.
func monitoredCluster(t *testing.T) (*cluster, []string) {
	policy, err := tiers.ParsePolicy("nvme:every=1,keep=2;pfs:every=2,keep=2")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testcluster.CoordinatorConfig(t)
	cfg.MetricsAddr, cfg.Replicas, cfg.Policy = "127.0.0.1:0", 1, policy
	co := testcluster.StartCoordinator(t, cfg)
	cl := &cluster{t: t, dataDir: cfg.DataDir, addr: co.Addr, stop: co.Stop}
	cl.dial()
	targets := []string{co.MetricsAddr}
	pfs := filepath.Join(t.TempDir(), "pfs")
	for i := range 3 {
		var nvme tiers.Store
		nvme, err := tiers.NewFileStore(filepath.Join(t.TempDir(), "nvme"), tiers.NVMeOptions())
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 { // the spare's NVMe is broken: its tier degrades once it holds ranks
			nvme = brokenStore{nvme}
		}
		shared, err := tiers.NewFileStore(pfs, tiers.PFSOptions())
		if err != nil {
			t.Fatal(err)
		}
		cl.addAgent(func(c *agent.Config) {
			c.Node, c.FailureDomain = fmt.Sprintf("node-%d", i), []string{"rack-a", "rack-b"}[i%2]
			c.MetricsAddr = "127.0.0.1:0"
			c.Stores = map[tiers.Name]tiers.Store{"nvme": nvme, "pfs": shared}
		})
		targets = append(targets, cl.agents[i].Addrs.Metrics)
	}
	cl.waitOrderStreams()
	return cl, targets
}

// brokenStore is a store whose every write fails.
type brokenStore struct{ tiers.Store }

func (brokenStore) Put(context.Context, string, io.ReaderAt, int64) error {
	return errors.New("test: this NVMe device is gone")
}

// renderAlerts executes the chart's alert rule file with the chart's
// values, as Helm's tpl does, metrics.prometheusRule's changed by set,
// and returns the rule file.
func renderAlerts(t *testing.T, set map[string]any) string {
	t.Helper()
	raw, err := os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096).Decode(&values); err != nil {
		t.Fatal(err)
	}
	rule := values["metrics"].(map[string]any)["prometheusRule"].(map[string]any)
	for k, v := range set {
		if _, ok := rule[k]; !ok {
			t.Fatalf("values.yaml has no metrics.prometheusRule.%s", k)
		}
		rule[k] = v
	}
	tmpl, err := template.New("alerts").Option("missingkey=error").ParseFiles(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := tmpl.ExecuteTemplate(&out, filepath.Base(alertsFile), map[string]any{"Values": values}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "alerts.yaml")
	if err := os.WriteFile(file, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

type panelQuery struct{ title, expr string }

// dashboardQueries returns every query of the chart's dashboard, its
// Grafana variables replaced: every job, a 10 s rate interval.
func dashboardQueries(t *testing.T) []panelQuery {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Type, Title string
			Targets     []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("$__rate_interval", "10s", "$job", ".*")
	var out []panelQuery
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, panelQuery{p.Title, vars.Replace(tg.Expr)})
		}
	}
	if len(out) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return out
}

// promServer is a Prometheus server run for a test.
type promServer struct {
	url string
	log *bytes.Buffer
}

// scrapeJob is a Prometheus scrape job of targets, daemons of role: over
// mutual TLS with the test cluster's reader certificate, as a
// Prometheus scrapes a cluster with TLS on (docs/operations.md), the
// daemons verified by their role's server name; plaintext with
// REWIND_TEST_PLAINTEXT=1.
func scrapeJob(t *testing.T, name string, role transport.Role, targets []string) string {
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = fmt.Sprintf("%q", tg)
	}
	job := fmt.Sprintf("  - job_name: %s\n    static_configs: [{targets: [%s]}]\n", name, strings.Join(quoted, ", "))
	if testcluster.Plaintext() {
		return job
	}
	dir := testcluster.TLSDir(t, testcluster.ReaderID)
	return job + fmt.Sprintf("    scheme: https\n    tls_config: {ca_file: %q, cert_file: %q, key_file: %q, server_name: %q, min_version: TLS13}\n",
		filepath.Join(dir, transport.CAFile), filepath.Join(dir, transport.CertFile), filepath.Join(dir, transport.KeyFile),
		transport.ServerName(role, ""))
}

// startPrometheus runs bin scraping targets (the coordinator's, then the
// agents') every second and evaluating
// the rule file every second, until the test ends.
func startPrometheus(t *testing.T, bin string, targets []string, rules string) *promServer {
	t.Helper()
	dir := t.TempDir()
	config := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
%s%s`, rules, scrapeJob(t, "rewind-coordinator", transport.RoleCoordinator, targets[:1]),
		scrapeJob(t, "rewind-agent", transport.RoleNode, targets[1:]))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := testcluster.FreeAddr(t)
	p := &promServer{url: "http://" + addr, log: &bytes.Buffer{}}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("prometheus log:\n%s", p.log)
		}
	})
	wait.ForNil(t, time.Minute, "prometheus ready", func() error {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("prometheus exited: %v\n%s", err, p.log)
		default:
		}
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %s", resp.Status)
		}
		return nil
	})
	return p
}

// get decodes the data of a Prometheus API answer into v; an answer
// whose status is not success (a query that does not parse) fails t.
func (p *promServer) get(t *testing.T, path string, v any) {
	t.Helper()
	resp, err := http.Get(p.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ans struct {
		Status, Error string
		Data          json.RawMessage
	}
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		t.Fatalf("prometheus %s: %v", path, err)
	}
	if ans.Status != "success" {
		t.Fatalf("prometheus %s: %s", path, ans.Error)
	}
	if err := json.Unmarshal(ans.Data, v); err != nil {
		t.Fatal(err)
	}
}

// hasNumber reports whether expr returns a sample whose value is a
// number (not NaN).
func (p *promServer) hasNumber(t *testing.T, expr string) bool {
	t.Helper()
	var data struct {
		Result []struct {
			Value [2]any `json:"value"`
		}
	}
	p.get(t, "/api/v1/query?query="+url.QueryEscape(expr), &data)
	for _, r := range data.Result {
		s, _ := r.Value[1].(string)
		var v float64
		if _, err := fmt.Sscan(s, &v); err == nil && !math.IsNaN(v) && !math.IsInf(v, 0) {
			return true
		}
	}
	return false
}

// rulesHealthy checks that Prometheus loaded the four alert rules and
// evaluated each without error.
func (p *promServer) rulesHealthy() error {
	resp, err := http.Get(p.url + "/api/v1/rules?type=alert")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var ans struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name, Health, LastError string
					EvaluationTime          float64
					LastEvaluation          time.Time
				}
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		return err
	}
	n := 0
	for _, g := range ans.Data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health != "ok" {
				return fmt.Errorf("rule %s: health %q (%s)", r.Name, r.Health, r.LastError)
			}
		}
	}
	if n != 4 {
		return fmt.Errorf("%d alert rules loaded, want 4", n)
	}
	return nil
}
