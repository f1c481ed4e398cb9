package enroll

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/transport"
)

// tokens is the coordinator's token check in these tests: a token names
// the node it proves (kube.TokenReviewer asks the API server instead).
var tokens = map[string]string{"token-of-n1": "n1", "token-of-n2": "n2"}

func nodeOf(_ context.Context, token string) (string, error) {
	if n, ok := tokens[token]; ok {
		return n, nil
	}
	return "", errors.New("token not authenticated")
}

// start runs a coordinator that enrolls nodes for validity, and returns
// an enrollment configuration of node n1 against it.
func start(t *testing.T, validity time.Duration) Config {
	t.Helper()
	if testcluster.Plaintext() {
		t.Skip("enrollment is over TLS")
	}
	ca, dir := testcluster.CA(t)
	cfg := testcluster.CoordinatorConfig(t)
	cfg.Enroll = &coordinator.EnrollConfig{CA: ca, NodeOf: nodeOf, Validity: validity}
	c := testcluster.StartCoordinator(t, cfg)
	tmp := t.TempDir()
	token := filepath.Join(tmp, "token")
	if err := os.WriteFile(token, []byte("token-of-n1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Config{Dir: filepath.Join(tmp, "tls"), Node: "n1", Coordinator: c.Addr,
		CAFile: filepath.Join(dir, "ca", transport.CAFile), TokenFile: token, Logger: testcluster.Discard()}
}

// A node with no certificate enrolls, and its directory then makes a
// transport that the coordinator knows as that node and no other.
func TestEnrollGivesTheNodeItsOwnCertificate(t *testing.T) {
	cfg := start(t, time.Hour)
	na, err := cfg.Ensure(context.Background(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(na); d < 55*time.Minute || d > 61*time.Minute {
		t.Fatalf("certificate valid for %v, want an hour", d)
	}
	sec, err := transport.Load(cfg.Dir, testcluster.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if id := sec.Identity(); id != (transport.Identity{Role: transport.RoleNode, Name: "n1"}) {
		t.Fatalf("identity %v, want node/n1", id)
	}
	conn, err := sec.NewClient(cfg.Coordinator, transport.ExpectCoordinator)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := coordpb.NewCoordinatorClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := api.ListJobs(ctx, &coordpb.ListJobsRequest{}); err != nil {
		t.Fatalf("node n1 lists jobs: %v", err)
	}
	// Kept to its own name: reporting for n2 is refused.
	_, err = api.Report(ctx, &coordpb.ReportRequest{Node: "n2"})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("n1 reports for n2: %v, want PermissionDenied", err)
	}
	// A certificate with most of its validity left is kept.
	before, _ := os.ReadFile(filepath.Join(cfg.Dir, transport.CertFile))
	if _, err := cfg.Ensure(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(filepath.Join(cfg.Dir, transport.CertFile)); string(after) != string(before) {
		t.Fatal("a fresh certificate was replaced")
	}
}

func TestEnrollRefused(t *testing.T) {
	cfg := start(t, time.Hour)
	cases := map[string]struct {
		token, node string
		want        codes.Code
		says        string
	}{
		"a token of another node": {"token-of-n2", "n1", codes.PermissionDenied, "proves node n2, not n1"},
		"a token of nobody":       {"forged", "n1", codes.Unauthenticated, "proves no node"},
		"a bad node name":         {"token-of-n1", "../n1", codes.InvalidArgument, "node"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := cfg
			cfg.Dir, cfg.Node = filepath.Join(t.TempDir(), "tls"), c.node
			if err := os.WriteFile(cfg.TokenFile, []byte(c.token), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := cfg.Once(context.Background())
			if status.Code(errors.Unwrap(err)) != c.want && !strings.Contains(err.Error(), c.want.String()) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Once = %v, want %v saying %q", err, c.want, c.says)
			}
			if _, err := os.Stat(filepath.Join(cfg.Dir, transport.CertFile)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused enrollment wrote a certificate: %v", err)
			}
		})
	}
}

// Keep renews the certificate when a third of its validity is left, and
// the daemon's transport picks the new one up with no restart.
func TestKeepRenewsBeforeExpiry(t *testing.T) {
	cfg := start(t, 6*time.Second)
	first, err := cfg.Ensure(context.Background(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sec, err := transport.Load(cfg.Dir, testcluster.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { cfg.Keep(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	wait.For(t, 20*time.Second, fmt.Sprintf("the certificate expiring at %v to be renewed", first), func() bool {
		return !sec.NotAfter().Equal(first)
	})
	if !sec.NotAfter().After(first) {
		t.Fatalf("renewed to %v, before %v", sec.NotAfter(), first)
	}
	if renewedAt := sec.NotAfter().Add(-6 * time.Second); renewedAt.After(first) {
		t.Fatalf("renewed at %v, after the old certificate expired at %v", renewedAt, first)
	}
}

// A coordinator not given a CA says so, rather than failing vaguely.
func TestEnrollOffSaysSo(t *testing.T) {
	cfg := start(t, time.Hour)
	c := testcluster.StartCoordinator(t, testcluster.CoordinatorConfig(t))
	cfg.Coordinator = c.Addr
	if _, err := cfg.Once(context.Background()); err == nil || !strings.Contains(err.Error(), "enrollment is off") {
		t.Fatalf("Once against a coordinator without --enroll-ca = %v", err)
	}
}
