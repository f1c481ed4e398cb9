package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestEveryMethodHasARule holds Rules to every method of every service
// the daemons serve, so that a method added to a .proto file cannot be
// left open (or silently shut): it fails until the table says who may
// call it.
func TestEveryMethodHasARule(t *testing.T) {
	want := map[string]bool{DataPath: true, HTTPMetrics: true, HTTPReady: true, HTTPDebug: true}
	for _, sd := range []grpc.ServiceDesc{coordpb.Coordinator_ServiceDesc, agentpb.Agent_ServiceDesc} {
		for _, m := range sd.Methods {
			want["/"+sd.ServiceName+"/"+m.MethodName] = true
		}
		for _, s := range sd.Streams {
			want["/"+sd.ServiceName+"/"+s.StreamName] = true
		}
	}
	for m := range want {
		if _, ok := Rules[m]; !ok {
			t.Errorf("no rule for %s: add it to Rules (transport/rules.go) with the roles that may call it", m)
		}
	}
	for m := range Rules {
		if !want[m] {
			t.Errorf("rule for %s, which no service has", m)
		}
	}
}

// pki is a CA and the directories of the identities it issued.
type pki struct {
	t   *testing.T
	ca  *CA
	dir string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca, err := NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &pki{t: t, ca: ca, dir: t.TempDir()}
}

func (p *pki) issue(leaf Leaf) string {
	p.t.Helper()
	if leaf.Validity == 0 {
		leaf.Validity = time.Hour
	}
	dir := filepath.Join(p.dir, leaf.Identity.Role.String()+"-"+strings.ReplaceAll(leaf.Identity.Name, "*", "any")+"-"+randName())
	if err := p.ca.IssueDir(dir, leaf); err != nil {
		p.t.Fatal(err)
	}
	return dir
}

func (p *pki) sec(id Identity) *Security {
	p.t.Helper()
	s, err := Load(p.issue(Leaf{Identity: id}), discard)
	if err != nil {
		p.t.Fatal(err)
	}
	return s
}

var nameSeq int

func randName() string {
	nameSeq++
	return string(rune('a'+nameSeq%26)) + time.Now().Format("150405.000000000")
}

// serve runs both services, answering Unimplemented to every call that
// authorization lets through (a stream after reading its first message,
// which is when the rules' Check runs).
func serve(t *testing.T, s *Security) string { return serveWith(t, s, nil) }

// serveWith is serve with au, when not nil, first in the chains.
func serveWith(t *testing.T, s *Security, au *Audit) string {
	t.Helper()
	l, err := s.Listen("test server", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAuthorizer(s, discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	unary, stream := []grpc.UnaryServerInterceptor{a.Unary}, []grpc.StreamServerInterceptor{a.Stream}
	if au != nil {
		unary, stream = append([]grpc.UnaryServerInterceptor{au.Unary}, unary...), append([]grpc.StreamServerInterceptor{au.Stream}, stream...)
	}
	srv := grpc.NewServer(s.ServerOption(), grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...))
	coordpb.RegisterCoordinatorServer(srv, stub{})
	agentpb.RegisterAgentServer(srv, agentpb.UnimplementedAgentServer{})
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return l.Addr().String()
}

// stub answers Unimplemented to every call, after reading the request of
// a client stream (which is when the rules' Check runs).
type stub struct {
	coordpb.UnimplementedCoordinatorServer
}

func (stub) ReportStream(s coordpb.Coordinator_ReportStreamServer) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	return status.Error(codes.Unimplemented, "stub")
}

func call(t *testing.T, s *Security, addr string, f func(context.Context, coordpb.CoordinatorClient) error) codes.Code {
	t.Helper()
	conn, err := s.NewClient(addr, ExpectCoordinator)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = f(ctx, coordpb.NewCoordinatorClient(conn))
	if err != nil {
		t.Logf("%v", err)
	}
	return status.Code(err)
}

func deleteStep(ctx context.Context, c coordpb.CoordinatorClient) error {
	_, err := c.DeleteStep(ctx, &coordpb.DeleteStepRequest{Job: "j", Step: 1})
	return err
}

func listJobs(ctx context.Context, c coordpb.CoordinatorClient) error {
	_, err := c.ListJobs(ctx, &coordpb.ListJobsRequest{})
	return err
}

func report(node string) func(context.Context, coordpb.CoordinatorClient) error {
	return func(ctx context.Context, c coordpb.CoordinatorClient) error {
		_, err := c.Report(ctx, &coordpb.ReportRequest{Node: node})
		return err
	}
}

func reportStream(node string) func(context.Context, coordpb.CoordinatorClient) error {
	return func(ctx context.Context, c coordpb.CoordinatorClient) error {
		s, err := c.ReportStream(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(&coordpb.ReportRequest{Node: node}); err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
}

func TestAuthorization(t *testing.T) {
	p := newPKI(t)
	addr := serve(t, p.sec(Identity{RoleCoordinator, "coord"}))
	other := newPKI(t)
	expired, err := Load(p.issue(Leaf{Identity: Identity{RoleOperator, "old"},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}), discard)
	if err != nil {
		t.Fatal(err)
	}
	// A client with the CA but no certificate of its own.
	bare := p.sec(Identity{RoleReader, "r"})
	bare.files.cur.cert.Certificate = nil

	type tc struct {
		s    *Security
		call func(context.Context, coordpb.CoordinatorClient) error
		want codes.Code
	}
	run := func(t *testing.T, c tc) {
		if got := call(t, c.s, addr, c.call); got != c.want {
			t.Errorf("got %v, want %v", got, c.want)
		}
	}
	cases := map[string]tc{
		"operator deletes":                  {p.sec(Identity{RoleOperator, "alice"}), deleteStep, codes.Unimplemented},
		"node deletes":                      {p.sec(Identity{RoleNode, "n1"}), deleteStep, codes.PermissionDenied},
		"reader deletes":                    {p.sec(Identity{RoleReader, "bob"}), deleteStep, codes.PermissionDenied},
		"reader lists":                      {p.sec(Identity{RoleReader, "bob"}), listJobs, codes.Unimplemented},
		"node reports for itself":           {p.sec(Identity{RoleNode, "n1"}), report("n1"), codes.Unimplemented},
		"node reports for another":          {p.sec(Identity{RoleNode, "n1"}), report("n2"), codes.PermissionDenied},
		"shared node cert reports for any":  {p.sec(Identity{RoleNode, AnyNode}), report("n2"), codes.Unimplemented},
		"node streams for another":          {p.sec(Identity{RoleNode, "n1"}), reportStream("n2"), codes.PermissionDenied},
		"operator reports":                  {p.sec(Identity{RoleOperator, "alice"}), report("n1"), codes.PermissionDenied},
		"no client certificate":             {bare, listJobs, codes.Unauthenticated},
		"no client certificate enrolls":     {bare, enroll, codes.Unimplemented},
		"another CA's certificate enrolls":  {clientOf(t, other, p), enroll, codes.Unimplemented},
		"certificate of another CA":         {clientOf(t, other, p), listJobs, codes.Unauthenticated},
		"expired certificate":               {expired, listJobs, codes.Unauthenticated},
		"plaintext client of a TLS server":  {Insecure(), listJobs, codes.Unavailable},
		"reader dry-runs a restore":         {p.sec(Identity{RoleReader, "bob"}), planRestoreCall(true), codes.Unimplemented},
		"reader restores":                   {p.sec(Identity{RoleReader, "bob"}), planRestoreCall(false), codes.PermissionDenied},
		"node registers a job with policy":  {p.sec(Identity{RoleNode, "n1"}), registerJobCall("n1", "nvme:every=1"), codes.PermissionDenied},
		"node places a rank on another":     {p.sec(Identity{RoleNode, "n1"}), registerJobCall("n2", ""), codes.PermissionDenied},
		"node places a rank on itself":      {p.sec(Identity{RoleNode, "n1"}), registerJobCall("n1", ""), codes.Unimplemented},
		"operator sets a policy":            {p.sec(Identity{RoleOperator, "alice"}), registerJobCall("n1", "nvme:every=1"), codes.Unimplemented},
		"coordinator declares a node down":  {p.sec(Identity{RoleCoordinator, "c2"}), nodeDown, codes.Unimplemented},
		"reader declares a node down":       {p.sec(Identity{RoleReader, "bob"}), nodeDown, codes.PermissionDenied},
		"node declares another node down":   {p.sec(Identity{RoleNode, "n1"}), nodeDown, codes.PermissionDenied},
		"node watches a job":                {p.sec(Identity{RoleNode, "n1"}), watch, codes.Unimplemented},
		"node lists jobs":                   {p.sec(Identity{RoleNode, "n1"}), listJobs, codes.Unimplemented},
		"operator lists after the refusals": {p.sec(Identity{RoleOperator, "alice"}), listJobs, codes.Unimplemented},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) { run(t, c) })
	}
}

func planRestoreCall(dry bool) func(context.Context, coordpb.CoordinatorClient) error {
	return func(ctx context.Context, c coordpb.CoordinatorClient) error {
		_, err := c.PlanRestore(ctx, &coordpb.PlanRestoreRequest{Job: "j", DryRun: dry})
		return err
	}
}

func registerJobCall(node, policy string) func(context.Context, coordpb.CoordinatorClient) error {
	return func(ctx context.Context, c coordpb.CoordinatorClient) error {
		_, err := c.RegisterJob(ctx, &coordpb.RegisterJobRequest{Job: "j", WorldSize: 2, Placement: map[uint32]string{0: node}, Policy: policy})
		return err
	}
}

func enroll(ctx context.Context, c coordpb.CoordinatorClient) error {
	_, err := c.Enroll(ctx, &coordpb.EnrollRequest{Token: "t"})
	return err
}

func nodeDown(ctx context.Context, c coordpb.CoordinatorClient) error {
	_, err := c.NodeDown(ctx, &coordpb.NodeDownRequest{Node: "n2"})
	return err
}

func watch(ctx context.Context, c coordpb.CoordinatorClient) error {
	s, err := c.WatchJob(ctx, &coordpb.WatchJobRequest{Job: "j"})
	if err != nil {
		return err
	}
	_, err = s.Recv()
	return err
}

// clientOf is an operator whose certificate other's CA issued, and that
// trusts trusted's CA (so that its own check of the server passes).
func clientOf(t *testing.T, other, trusted *pki) *Security {
	t.Helper()
	certPEM, keyPEM, err := other.ca.Issue(Leaf{Identity: Identity{RoleOperator, "mallory"}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "mallory")
	if err := WriteDir(dir, certPEM, keyPEM, trusted.ca.PEM); err != nil {
		t.Fatal(err)
	}
	s, err := Load(dir, discard)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestClientChecksServer: a client refuses a server whose certificate
// another CA issued, or that is not the identity it expects.
func TestClientChecksServer(t *testing.T) {
	p := newPKI(t)
	addr := serve(t, p.sec(Identity{RoleNode, "n1"})) // not a coordinator
	op := p.sec(Identity{RoleOperator, "alice"})
	if got := call(t, op, addr, listJobs); got != codes.Unavailable {
		t.Errorf("dialing a node as the coordinator: got %v, want Unavailable", got)
	}
	other := newPKI(t)
	addr2 := serve(t, other.sec(Identity{RoleCoordinator, "evil"}))
	if got := call(t, op, addr2, listJobs); got != codes.Unavailable {
		t.Errorf("dialing a coordinator of another CA: got %v, want Unavailable", got)
	}
}

// TestReload: new files in the directory are used by the next handshake,
// a half-written pair keeps the old one.
func TestReload(t *testing.T) {
	p := newPKI(t)
	dir := p.issue(Leaf{Identity: Identity{RoleCoordinator, "c"}})
	srv, err := Load(dir, discard)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, srv)
	op := p.sec(Identity{RoleOperator, "alice"})
	serverSerial := func() string {
		t.Helper()
		c, err := op.DialData(context.Background(), addr, ExpectCoordinator)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	before := serverSerial()
	certPEM, keyPEM, err := p.ca.Issue(Leaf{Identity: Identity{RoleCoordinator, "c"}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFile(filepath.Join(dir, KeyFile), keyPEM, 0o600); err != nil { // the key alone: a mismatched pair
		t.Fatal(err)
	}
	if got := serverSerial(); got != before {
		t.Fatalf("a mismatched pair was used: serial %s, want the old %s", got, before)
	}
	if err := writeFile(filepath.Join(dir, CertFile), certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(certPEM)
	cert, _ := x509.ParseCertificate(blk.Bytes)
	if got := serverSerial(); got != cert.SerialNumber.String() {
		t.Fatalf("after rotation the server presents serial %s, want %s", got, cert.SerialNumber)
	}
	if srv.reloads.Load() != 1 {
		t.Errorf("reloads %d, want 1", srv.reloads.Load())
	}
}

func TestPlaintextOnlyOnLoopback(t *testing.T) {
	var plain *Security
	for addr, ok := range map[string]bool{"127.0.0.1:0": true, "[::1]:0": true, "localhost:0": true, ":0": false, "0.0.0.0:0": false} {
		l, err := plain.Listen("test", addr)
		if ok != (err == nil) {
			t.Errorf("listen %s without TLS: err %v, want allowed %v", addr, err, ok)
		}
		if l != nil {
			l.Close()
		}
	}
	if _, err := plain.NewClient("coordinator.example:7080", ExpectCoordinator); err == nil {
		t.Error("plaintext dial of a remote address allowed without --insecure")
	}
	l, err := Insecure().Listen("test", "0.0.0.0:0")
	if err != nil {
		t.Fatalf("insecure listen on every interface: %v", err)
	}
	l.Close()
	if _, err := New(Config{Dir: "x", Insecure: true}); err == nil {
		t.Error("a certificate directory and insecure together accepted")
	}
}

func TestIdentityOf(t *testing.T) {
	for name, c := range map[string]struct {
		uri  string
		want Identity
		err  string
	}{
		"node":           {"spiffe://rewind/node/gpu-1", Identity{RoleNode, "gpu-1"}, ""},
		"shared node":    {"spiffe://rewind/node/*", Identity{RoleNode, AnyNode}, ""},
		"operator":       {"spiffe://rewind/operator/alice", Identity{RoleOperator, "alice"}, ""},
		"other domain":   {"spiffe://example.org/node/gpu-1", Identity{}, "names no identity"},
		"unknown role":   {"spiffe://rewind/admin/root", Identity{}, "unknown role"},
		"too deep":       {"spiffe://rewind/node/a/b", Identity{}, "not spiffe://rewind/ROLE/NAME"},
		"shared reader":  {"spiffe://rewind/reader/*", Identity{}, "identity name"},
		"empty name":     {"spiffe://rewind/reader/", Identity{}, "identity name"},
		"no uri at all ": {"", Identity{}, "names no identity"},
	} {
		t.Run(name, func(t *testing.T) {
			cert := &x509.Certificate{}
			if c.uri != "" {
				u, err := url.Parse(c.uri)
				if err != nil {
					t.Fatal(err)
				}
				cert.URIs = append(cert.URIs, u)
			}
			got, err := IdentityOf(cert, DefaultTrustDomain)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("got %v, %v; want an error containing %q", got, err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

// TestDataPathResumes: a second connection of the data path to the same
// server resumes the TLS session (no certificates sent or signed), and
// both ends still know and check who the other is.
func TestDataPathResumes(t *testing.T) {
	p := newPKI(t)
	srv, cli := p.sec(Identity{RoleNode, "a"}), p.sec(Identity{RoleNode, "b"})
	l, err := srv.Listen("test", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				peer := PeerOf(c)
				msg := peer.Identity.String()
				if peer.Err != nil {
					msg = peer.Err.Error()
				}
				_, _ = c.Write([]byte(msg + "\n"))
			}()
		}
	}()
	for i, wantResumed := range []bool{false, true} {
		c, err := cli.DialData(context.Background(), l.Addr().String(), ExpectNode("a"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(b) != "node/b\n" {
			t.Fatalf("connection %d: the server saw %q (%v)", i, b, err)
		}
		if got := c.(*tls.Conn).ConnectionState().DidResume; got != wantResumed {
			t.Errorf("connection %d resumed %v, want %v", i, got, wantResumed)
		}
	}
	// A client that expects another node refuses the resumed session too.
	if _, err := cli.DialData(context.Background(), l.Addr().String(), ExpectNode("z")); err == nil {
		t.Fatal("a resumed session skipped the server's identity check")
	}
}

// TestDataDialToAFrozenPeerEnds: a peer whose kernel accepts the
// connection and whose process never answers (a paused node) fails the
// dial after HandshakeTimeout, even under a context with no end (a
// replica copy's); before, the copy waited for good, holding the rank's
// copy lock that a restore of the rank needed.
func TestDataDialToAFrozenPeerEnds(t *testing.T) {
	defer func(d time.Duration) { HandshakeTimeout = d }(HandshakeTimeout)
	HandshakeTimeout = 200 * time.Millisecond
	p := newPKI(t)
	cli := p.sec(Identity{RoleNode, "b"})
	l, err := net.Listen("tcp", "127.0.0.1:0") // accepts (the backlog), never reads
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		_, err := cli.DialData(context.Background(), l.Addr().String(), ExpectNode("a"))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "TLS handshake") {
			t.Fatalf("DialData to a peer that never answers: %v, want a failed TLS handshake", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("DialData to a peer that never answers is still waiting after 10 s")
	}
}
