package metricsrv

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/transport"
)

// pki issues certificate directories of one CA.
type pki struct {
	t   *testing.T
	ca  *transport.CA
	dir string
}

func newPKI(t *testing.T, name string) *pki {
	ca, err := transport.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &pki{t: t, ca: ca, dir: t.TempDir()}
}

// sec is the Security of a new certificate for id.
func (p *pki) sec(id transport.Identity) *transport.Security {
	p.t.Helper()
	dir := filepath.Join(p.dir, id.Role.String()+"-"+id.Name)
	if err := p.ca.IssueDir(dir, transport.Leaf{Identity: id, Validity: time.Hour}); err != nil {
		p.t.Fatal(err)
	}
	s, err := transport.Load(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		p.t.Fatal(err)
	}
	return s
}

// stranger is the Security of a certificate for id from another CA, which
// trusts p's CA (so that it is the server that refuses it).
func (p *pki) stranger(id transport.Identity) *transport.Security {
	p.t.Helper()
	other := newPKI(p.t, "another CA")
	cert, key, err := other.ca.Issue(transport.Leaf{Identity: id, Validity: time.Hour})
	if err != nil {
		p.t.Fatal(err)
	}
	dir := filepath.Join(p.dir, "stranger")
	if err := transport.WriteDir(dir, cert, key, p.ca.PEM); err != nil {
		p.t.Fatal(err)
	}
	s, err := transport.Load(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		p.t.Fatal(err)
	}
	return s
}

// answer is what a GET or PUT of url answered: the status code, or the
// error of a request that got none.
func answer(c *http.Client, method, url string) (int, string, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(""))
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestMetricsOverMutualTLS: a daemon with a certificate serves its
// metrics address over TLS, and only to the callers transport.Rules
// allows: a reader (a Prometheus) scrapes /metrics; a caller with no
// certificate, one of another CA, or a node's is refused /metrics with
// 401 or 403 naming why; plaintext HTTP gets nothing; the readiness
// probe answers any TLS caller (a kubelet sends no certificate); the
// fault injector's admin endpoint takes an operator only. The refusals
// are counted. Without TLS, plaintext beyond loopback is refused at
// start.
func TestMetricsOverMutualTLS(t *testing.T) {
	p := newPKI(t, "rewind CA")
	server := p.sec(transport.Identity{Role: transport.RoleNode, Name: "gpu-1"})
	reg := prometheus.NewRegistry()
	authz, err := transport.NewAuthorizer(server, slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	ready := Route{Path: "/readyz", Method: transport.HTTPReady, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})}
	srv, err := Start(Config{Addr: "127.0.0.1:0", Registry: reg, Security: server, Authorizer: authz}, errc,
		append(FaultRoutes(faultinject.New(slog.New(slog.DiscardHandler), 1)), ready)...)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	url := func(path string) string { return "https://" + srv.Addr + path }
	expect := transport.ExpectNode("gpu-1")
	client := func(id transport.Identity) *http.Client { return p.sec(id).HTTPClient(expect) }
	reader := client(transport.Identity{Role: transport.RoleReader, Name: "prometheus"})
	operator := client(transport.Identity{Role: transport.RoleOperator, Name: "alice"})
	node := client(transport.Identity{Role: transport.RoleNode, Name: "gpu-2"})
	stranger := p.stranger(transport.Identity{Role: transport.RoleReader, Name: "prometheus"}).HTTPClient(expect)
	// No client certificate at all: what a kubelet's HTTPS probe is.
	anonymous := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

	for _, c := range []struct {
		name, method, path string
		client             *http.Client
		code               int
		says               string
	}{
		{"a reader scrapes", http.MethodGet, "/metrics", reader, http.StatusOK, ""},
		{"an operator scrapes", http.MethodGet, "/metrics", operator, http.StatusOK, ""},
		{"no certificate", http.MethodGet, "/metrics", anonymous, http.StatusUnauthorized, "no client certificate"},
		{"another CA", http.MethodGet, "/metrics", stranger, http.StatusUnauthorized, "unauthenticated caller"},
		{"a node", http.MethodGet, "/metrics", node, http.StatusForbidden, "node/gpu-2 may not call " + transport.HTTPMetrics},
		{"a probe with no certificate", http.MethodGet, "/readyz", anonymous, http.StatusOK, "ok"},
		{"a reader arms a fault", http.MethodPut, faultinject.HandlerPath, reader, http.StatusForbidden, "operator, coordinator only"},
		{"a reader dumps goroutines", http.MethodGet, GoroutinesPath, reader, http.StatusForbidden, "operator, coordinator only"},
		{"an operator dumps goroutines", http.MethodGet, GoroutinesPath, operator, http.StatusOK, "goroutine "},
	} {
		code, body, err := answer(c.client, c.method, url(c.path))
		if err != nil || code != c.code || !strings.Contains(body, c.says) {
			t.Errorf("%s: %s %s: %d %.200q %v; want %d saying %q", c.name, c.method, c.path, code, body, err, c.code, c.says)
		}
	}
	if code, _, err := answer(http.DefaultClient, http.MethodGet, "http://"+srv.Addr+"/metrics"); err == nil {
		t.Errorf("plaintext GET /metrics of a TLS metrics address: %d, want no answer", code)
	}
	// The refusals above are counted where the daemon's other refusals are.
	_, body, err := answer(reader, http.MethodGet, url("/metrics"))
	if err != nil || !strings.Contains(body, `rewind_transport_refused_calls_total{code="PermissionDenied"} 3`) ||
		!strings.Contains(body, `rewind_transport_refused_calls_total{code="Unauthenticated"} 2`) {
		t.Errorf("refusals counted: %v\n%s", err, body)
	}
	if _, err := Start(Config{Addr: "0.0.0.0:0"}, errc); err == nil || !strings.Contains(err.Error(), "--tls-dir") {
		t.Errorf("plaintext metrics on every interface without --insecure: %v", err)
	}
}
