package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/transport"
)

// The rewind binary of these tests is built once and removed at the end.
func TestMain(m *testing.M) { testcluster.Main(m, nil) }

// daemon is a process of the rewind binary, killed when the test ends.
type daemon struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	d := &daemon{cmd: exec.Command(testcluster.Binary(t, testcluster.RewindPackage), args...), out: &syncBuffer{}, done: make(chan struct{})}
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		_ = d.cmd.Process.Kill()
		<-d.done
		if t.Failed() {
			t.Logf("rewind %s:\n%s", args[0], d.out)
		}
	})
	return d
}

func (d *daemon) running() bool {
	select {
	case <-d.done:
		return false
	default:
		return true
	}
}

// secureCluster is a coordinator and one agent (node n1), processes of
// the rewind binary with mutual TLS, and the certificates `rewind certs`
// made for them.
type secureCluster struct {
	certs, coordAddr, agentAddr, socket, coordMetrics string
	coord, agent                                      *daemon
}

func startSecureCluster(t *testing.T) *secureCluster {
	t.Helper()
	c := &secureCluster{certs: filepath.Join(t.TempDir(), "certs"), coordAddr: testcluster.FreeAddr(t), agentAddr: testcluster.FreeAddr(t),
		coordMetrics: testcluster.FreeAddr(t)}
	if out, err := exec.Command(testcluster.Binary(t, testcluster.RewindPackage), "certs", "--out", c.certs, "--nodes", "n1,n2", "--operator", "alice", "--reader", "bob").CombinedOutput(); err != nil {
		t.Fatalf("rewind certs: %v\n%s", err, out)
	}
	c.coord = startDaemon(t, "coordinator", "--listen", c.coordAddr, "--metrics", c.coordMetrics, "--data", filepath.Join(t.TempDir(), "data"),
		"--gossip", "", "--tls-dir", filepath.Join(c.certs, "coordinator"))
	api := c.client(t, "operator")
	wait.ForNil(t, 20*time.Second, "the coordinator to answer an operator over TLS", func() error {
		_, err := api.ListJobs(ctxT(t), &coordpb.ListJobsRequest{})
		return err
	})
	c.socket = filepath.Join(t.TempDir(), "a.sock")
	c.agent = startDaemon(t, "agent", "--node", "n1", "--shm-root", filepath.Join(testcluster.ShmDir(t), "shm"), "--socket", c.socket,
		"--listen", c.agentAddr, "--advertise", c.agentAddr, "--metrics", "", "--coordinator", c.coordAddr, "--gossip", "",
		"--tls-dir", filepath.Join(c.certs, "node", "n1"), "--job-key", filepath.Join(c.certs, "job.key"))
	wait.ForNil(t, 20*time.Second, "the agent to register with the coordinator", func() error {
		resp, err := api.TierStatus(ctxT(t), &coordpb.TierStatusRequest{})
		if err == nil && len(resp.Nodes) != 1 {
			err = fmt.Errorf("%d agents connected", len(resp.Nodes))
		}
		return err
	})
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (c *secureCluster) sec(t *testing.T, dir string) *transport.Security {
	t.Helper()
	s, err := transport.Load(filepath.Join(c.certs, dir), testcluster.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// client is a client of the coordinator with the certificate in dir
// (under the cluster's certificates).
func (c *secureCluster) client(t *testing.T, dir string) coordpb.CoordinatorClient {
	t.Helper()
	return clientWith(t, c.sec(t, dir), c.coordAddr)
}

func clientWith(t *testing.T, s *transport.Security, addr string) coordpb.CoordinatorClient {
	t.Helper()
	conn, err := s.NewClient(addr, transport.ExpectCoordinator)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return coordpb.NewCoordinatorClient(conn)
}

// noCertConn is a TLS client of addr that presents no certificate.
func noCertConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestRefusedCallsLeaveTheDaemonsUp: against a coordinator and an agent
// running with mutual TLS, a client with no certificate, one from
// another CA and an expired one are refused Unauthenticated; a node's
// certificate calling operators' methods, or reporting for another node,
// and a reader's reading shard bytes are refused PermissionDenied; each
// refusal names the caller and the method. The daemons stay up and
// serve the rank's saves and the operator all along.
// refusal is a call that must be refused with code, its message naming
// says.
type refusal struct {
	call func(ctx context.Context) error
	code codes.Code
	says []string
}

// strangers are two operators the cluster must not trust: one whose
// certificate expired, and mallory, whose certificate another CA issued
// (she trusts the cluster's CA, so that her own check of the server
// passes).
func strangers(t *testing.T, c *secureCluster) (expired, mallory *transport.Security) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "expired")
	ca, err := transport.LoadCA(filepath.Join(c.certs, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueDir(dir, transport.Leaf{Identity: transport.Identity{Role: transport.RoleOperator, Name: "old"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other")
	if out, err := exec.Command(testcluster.Binary(t, testcluster.RewindPackage), "certs", "--out", other, "--operator", "mallory").CombinedOutput(); err != nil {
		t.Fatalf("rewind certs: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(filepath.Join(c.certs, "ca", transport.CAFile))
	if err := os.WriteFile(filepath.Join(other, "operator", transport.CAFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	load := func(dir string) *transport.Security {
		s, err := transport.Load(dir, testcluster.Discard())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	return load(dir), load(filepath.Join(other, "operator"))
}

// refusals are the calls TestRefusedCallsLeaveTheDaemonsUp makes: with no
// certificate, another CA's, an expired one, and the cluster's own
// certificates calling what their roles do not allow.
func refusals(t *testing.T, c *secureCluster) map[string]refusal {
	t.Helper()
	expired, mallory := strangers(t, c)
	n1, bob := c.client(t, filepath.Join("node", "n1")), c.client(t, "reader")
	agentAs := func(dir string) agentpb.AgentClient {
		conn, err := c.sec(t, dir).NewClient(c.agentAddr, transport.ExpectNode("n1"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return agentpb.NewAgentClient(conn)
	}
	listJobs := func(api coordpb.CoordinatorClient) func(context.Context) error {
		return func(ctx context.Context) error { _, err := api.ListJobs(ctx, &coordpb.ListJobsRequest{}); return err }
	}
	return map[string]refusal{
		"no certificate": {listJobs(coordpb.NewCoordinatorClient(noCertConn(t, c.coordAddr))), codes.Unauthenticated,
			[]string{"ListJobs", "no client certificate"}},
		"no certificate, agent": {func(ctx context.Context) error {
			_, err := agentpb.NewAgentClient(noCertConn(t, c.agentAddr)).Status(ctx, &agentpb.StatusRequest{})
			return err
		}, codes.Unauthenticated, []string{"Agent/Status", "no client certificate"}},
		"another CA's certificate": {listJobs(clientWith(t, mallory, c.coordAddr)), codes.Unauthenticated,
			[]string{"ListJobs", "operator/mallory", "unknown authority"}},
		"expired certificate": {listJobs(clientWith(t, expired, c.coordAddr)), codes.Unauthenticated,
			[]string{"ListJobs", "operator/old", "expired"}},
		"node deletes a step": {func(ctx context.Context) error {
			_, err := n1.DeleteStep(ctx, &coordpb.DeleteStepRequest{Job: "j", Step: 1})
			return err
		}, codes.PermissionDenied, []string{"node/n1", "DeleteStep"}},
		"node declares another down": {func(ctx context.Context) error {
			_, err := n1.NodeDown(ctx, &coordpb.NodeDownRequest{Node: "n2"})
			return err
		}, codes.PermissionDenied, []string{"node/n1", "NodeDown"}},
		"node reports for another": {func(ctx context.Context) error {
			_, err := n1.Report(ctx, &coordpb.ReportRequest{Node: "n2", Shards: []*coordpb.ShardRecord{{Job: "j", Step: 1, WorldSize: 1, Node: "n2",
				State: coordpb.CopyState_COPY_STATE_COMMITTED}}})
			return err
		}, codes.PermissionDenied, []string{"node/n1", "Report", `"n2"`}},
		"node registers as another": {func(ctx context.Context) error {
			_, err := n1.Register(ctx, &coordpb.RegisterRequest{Node: &coordpb.Node{Name: "n2", Addr: c.agentAddr}})
			return err
		}, codes.PermissionDenied, []string{"node/n1", "Register", `"n2"`}},
		"reader restores": {func(ctx context.Context) error {
			_, err := bob.PlanRestore(ctx, &coordpb.PlanRestoreRequest{Job: "j", Step: -1})
			return err
		}, codes.PermissionDenied, []string{"reader/bob", "PlanRestore"}},
		"node deletes on an agent": {func(ctx context.Context) error {
			_, err := agentAs(filepath.Join("node", "n2")).Delete(ctx, &agentpb.DeleteRequest{Job: "j", Rank: 0, Step: 1})
			return err
		}, codes.PermissionDenied, []string{"node/n2", "Agent/Delete"}},
		"reader reads shard bytes": {func(ctx context.Context) error {
			s, err := agentAs("reader").Read(ctx, &agentpb.ReadRequest{Job: "j", Rank: 0, Step: 1})
			if err == nil {
				_, err = s.Recv()
			}
			return err
		}, codes.PermissionDenied, []string{"reader/bob", "Agent/Read"}},
		"operator saves into an agent over TCP": {func(ctx context.Context) error {
			_, err := agentAs("operator").Prepare(ctx, &agentpb.PrepareRequest{Job: "j", Rank: 0, WorldSize: 1, Step: 1, SizeBytes: 1 << 30})
			return err
		}, codes.PermissionDenied, []string{"operator/alice", "Prepare", "Unix socket only"}},
	}
}

func TestRefusedCallsLeaveTheDaemonsUp(t *testing.T) {
	c := startSecureCluster(t)
	op := c.client(t, "operator")
	cases := refusals(t, c)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.call(ctxT(t))
			if status.Code(err) != tc.code {
				t.Fatalf("got %v, want %v", err, tc.code)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the refusal %q does not name %q", err, s)
				}
			}
		})
	}
	t.Run("data path without a certificate", func(t *testing.T) {
		if msg := dataPathAs(t, c.agentAddr, nil); !strings.Contains(msg, "Unauthenticated") || !strings.Contains(msg, "PeerData") {
			t.Fatalf("the data path answered %q", msg)
		}
	})
	t.Run("data path as a reader", func(t *testing.T) {
		if msg := dataPathAs(t, c.agentAddr, c.sec(t, "reader")); !strings.Contains(msg, "PermissionDenied") || !strings.Contains(msg, "reader/bob") {
			t.Fatalf("the data path answered %q", msg)
		}
	})
	// Both daemons are up and serve: a rank saves, the step is
	// consistent, the operator sees it.
	if !c.coord.running() || !c.agent.running() {
		t.Fatal("a daemon exited after the refused calls")
	}
	// The agent isolates jobs with the key `rewind certs` wrote: a rank
	// without its job's token, or with another job's, is refused.
	for who, opts := range map[string]sdk.Options{"no token": {}, "job k's token": {JobToken: jobToken(t, c.certs, "k")}} {
		cl, err := sdk.Dial(ctxT(t), c.socket, opts)
		if err != nil {
			t.Fatal(err)
		}
		s, err := cl.Session("j", 0, 1)
		if err == nil {
			err = s.Save(ctxT(t), 1, []sdk.Tensor{{Name: "w", DType: shm.F32, Shape: []int64{256}, Data: make([]byte, 1024)}}, nil)
		}
		cl.Close()
		if !errors.Is(err, sdk.ErrPermission) {
			t.Fatalf("a save of job j with %s: %v, want a refusal", who, err)
		}
	}
	saveSteps(t, c.socket, c.certs, "j", 1, 1)
	waitLatest(t, op, "j", 1)
	if m := metric(t, c.sec(t, "reader"), c.coordMetrics, "rewind_transport_refused_calls_total"); !strings.Contains(m, `code="Unauthenticated"`) || !strings.Contains(m, `code="PermissionDenied"`) {
		t.Errorf("refusals not counted: %s", m)
	}
}

// dataPathAs asks the agent's peer data path for a shard over TLS with
// s's certificate (none when nil) and returns the refusal's message.
func dataPathAs(t *testing.T, addr string, s *transport.Security) string {
	t.Helper()
	var conn net.Conn
	var err error
	if s == nil {
		conn, err = tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, NextProtos: []string{transport.ProtoData}})
	} else {
		conn, err = s.DialData(ctxT(t), addr, transport.ExpectNode("n1"))
	}
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	body := []byte(`{"job":"j","rank":0,"step":1}`)
	req := append([]byte("RWND"), 0, 0, 0, 0)
	binary.BigEndian.PutUint32(req[4:], uint32(len(body)))
	if _, err := conn.Write(append(req, body...)); err != nil {
		t.Fatal(err)
	}
	var hdr [5]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		t.Fatalf("no answer from the data path: %v", err)
	}
	if hdr[0] != 1 {
		t.Fatalf("the data path served a shard (status %d)", hdr[0])
	}
	msg := make([]byte, min(binary.BigEndian.Uint32(hdr[1:]), 4096))
	_, _ = io.ReadFull(conn, msg)
	return string(msg)
}

// jobToken is job's token under the job key in certs, as `rewind
// job-token` prints it.
func jobToken(t *testing.T, certs, job string) string {
	t.Helper()
	out, err := exec.Command(testcluster.Binary(t, testcluster.RewindPackage), "job-token", "--key", filepath.Join(certs, "job.key"), job).Output()
	if err != nil {
		t.Fatalf("rewind job-token: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// saveSteps saves steps first to last of rank 0 of job (world size 1)
// through the agent's socket, with the job's token under the job key in
// certs; each must succeed.
func saveSteps(t *testing.T, socket, certs, job string, first, last int64) {
	t.Helper()
	cl, err := sdk.Dial(ctxT(t), socket, sdk.Options{JobToken: jobToken(t, certs, job)})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s, err := cl.Session(job, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for step := first; step <= last; step++ {
		if err := s.Save(ctxT(t), step, []sdk.Tensor{{Name: "w", DType: shm.F32, Shape: []int64{256}, Data: make([]byte, 1024)}}, nil); err != nil {
			t.Fatalf("save of step %d: %v", step, err)
		}
	}
}

func waitLatest(t *testing.T, api coordpb.CoordinatorClient, job string, step int64) {
	t.Helper()
	wait.ForNil(t, 20*time.Second, fmt.Sprintf("step %d of %s consistent", step, job), func() error {
		resp, err := api.Latest(ctxT(t), &coordpb.LatestRequest{Job: job})
		if err == nil && resp.Step != step {
			err = fmt.Errorf("latest %d", resp.Step)
		}
		return err
	})
}

// metric returns the lines of the Prometheus text at addr that name m,
// scraped with sec's certificate (nil: plaintext) from a coordinator.
func metric(t *testing.T, sec *transport.Security, addr, m string) string {
	t.Helper()
	resp, err := sec.HTTPClient(transport.ExpectCoordinator).Get(sec.URL(addr, "/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, m) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
