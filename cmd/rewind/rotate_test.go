package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/transport"
)

// TestRotationDropsNoSave: while a rank saves step after step (40, each
// reported over the agent's TLS connection to the coordinator and made
// consistent), the coordinator's and the node's certificates are issued
// again on disk three times, as cert-manager renews them. Each time both
// running daemons present the new certificate at their next handshake,
// a new mutual handshake between them works (the coordinator dials the
// agent to verify a step), and no save fails or goes unrecorded.
func TestRotationDropsNoSave(t *testing.T) {
	c := startSecureCluster(t)
	op := c.client(t, "operator")
	bin := testcluster.Binary(t, testcluster.RewindPackage)
	const steps, every = 40, 10
	for first := int64(1); first <= steps; first += every {
		saveSteps(t, c.socket, c.certs, "rot", first, first+every-1)
		if first+every > steps {
			break
		}
		// `rewind certs` again: new keys and certificates from the same
		// CA, renamed into place file by file.
		if out, err := exec.Command(bin, "certs", "--out", c.certs, "--nodes", "n1", "--operator", "", "--reader", "").CombinedOutput(); err != nil {
			t.Fatalf("rewind certs: %v\n%s", err, out)
		}
		for _, d := range []struct{ addr, dir string }{{c.coordAddr, "coordinator"}, {c.agentAddr, filepath.Join("node", "n1")}} {
			want := serialIn(t, filepath.Join(c.certs, d.dir))
			wait.For(t, 10*time.Second, d.dir+" serving its new certificate", func() bool {
				return servedSerial(t, d.addr) == want
			})
		}
		// The coordinator dials the agent anew: both new certificates, in
		// one mutual handshake.
		waitLatest(t, op, "rot", first+every-1)
		v, err := op.VerifyStep(ctxT(t), &coordpb.StepRequest{Job: "rot", Step: first + every - 1})
		if err != nil || !v.Ok {
			t.Fatalf("verify after rotation %d: %v %v", first/every+1, v, err)
		}
	}
	waitLatest(t, op, "rot", steps)
	resp, err := op.ListSteps(ctxT(t), &coordpb.ListStepsRequest{Job: "rot"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range resp.Steps {
		if s.State != coordpb.StepState_STEP_STATE_CONSISTENT && s.State != coordpb.StepState_STEP_STATE_UNSPECIFIED {
			t.Errorf("step %d is %v", s.Step, s.State)
		}
	}
	// At least one reload per rotation (more when a handshake came
	// between two of its files).
	if m := metric(t, c.sec(t, "reader"), c.coordMetrics, "rewind_transport_cert_reloads_total"); len(m) < 2 || m[len(m)-2] != ' ' || m[len(m)-1] < '3' {
		t.Errorf("the coordinator's reloads: %q, want at least 3", m)
	}
	if !c.coord.running() || !c.agent.running() {
		t.Fatal("a daemon exited")
	}
}

// serialIn is the serial number of the certificate in dir.
func serialIn(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, transport.CertFile))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert.SerialNumber.String()
}

// servedSerial is the serial number of the certificate the server at
// addr presents to a new connection.
func servedSerial(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, NextProtos: []string{transport.ProtoData}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestPlaintextRefusedBeyondLoopback: a daemon told to listen on every
// interface without a certificate directory (its gRPC or its metrics
// address) refuses to start, with one
// line that says what to do; with --insecure it starts, says so loudly
// and shows it in its metrics.
func TestPlaintextRefusedBeyondLoopback(t *testing.T) {
	bin := testcluster.Binary(t, testcluster.RewindPackage)
	for _, args := range [][]string{
		{"coordinator", "--listen", "0.0.0.0:0", "--metrics", "", "--gossip", "", "--data", t.TempDir()},
		{"agent", "--node", "n1", "--listen", ":0", "--metrics", "", "--gossip", "", "--shm-root", filepath.Join(testcluster.ShmDir(t), "shm"),
			"--socket", filepath.Join(t.TempDir(), "a.sock")},
		// The metrics address too, with gRPC on loopback.
		{"coordinator", "--listen", "127.0.0.1:0", "--metrics", ":0", "--gossip", "", "--data", t.TempDir()},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		last := lines[len(lines)-1]
		if err == nil || !strings.Contains(last, "refusing to listen on") || !strings.Contains(last, "--tls-dir") || !strings.Contains(last, "--insecure") {
			t.Fatalf("rewind %s on every interface in plaintext: %v\n%s", args[0], err, out)
		}
		if strings.Contains(string(out), "serving") {
			t.Fatalf("rewind %s served before refusing:\n%s", args[0], out)
		}
		t.Logf("rewind %s: %s", args[0], last)
	}
	metrics := testcluster.FreeAddr(t)
	d := startDaemon(t, "coordinator", "--listen", "0.0.0.0:0", "--metrics", metrics, "--gossip", "", "--data", t.TempDir(), "--insecure")
	wait.For(t, 20*time.Second, "the insecure coordinator to serve", func() bool { return strings.Contains(d.out.String(), "coordinator serving") })
	if !strings.Contains(d.out.String(), "level=ERROR") || !strings.Contains(d.out.String(), "WITHOUT TLS") {
		t.Errorf("no loud line about --insecure:\n%s", d.out)
	}
	if m := metric(t, nil, metrics, "rewind_transport_insecure"); m != "rewind_transport_insecure 1" {
		t.Errorf("metric %q, want rewind_transport_insecure 1", m)
	}
}

// TestNodeRunsWithTLS: `rewind node`, as each container of the compose
// cluster runs it, with its node's certificate: the agent registers and
// reports over TLS, and the ranks' supervisor (placement from ListJobs,
// recoveries from WatchJob) is allowed every call it makes, so the job's
// rank trains to its last step.
func TestNodeRunsWithTLS(t *testing.T) {
	c := startSecureCluster(t) // its own agent is node n1; the node here is n2
	op := c.client(t, "operator")
	trainer := testcluster.Binary(t, "rewind.dev/rewind/cmd/rewind-dev")
	listen := testcluster.FreeAddr(t)
	n := startDaemon(t, "node", "--job", "nodejob", "--world-size", "1", "--ranks", "0", "--steps", "6", "--size", "64KiB",
		"--step-time", "20ms", "--trainer", trainer, "--",
		"--node", "n2", "--coordinator", c.coordAddr, "--listen", listen, "--advertise", listen, "--metrics", "", "--gossip", "",
		"--shm-root", filepath.Join(testcluster.ShmDir(t), "shm"), "--socket", filepath.Join(t.TempDir(), "n2.sock"),
		"--tls-dir", filepath.Join(c.certs, "node", "n2"))
	wait.ForNil(t, 60*time.Second, "rank 0 of nodejob to reach step 6 through rewind node", func() error {
		if !n.running() {
			t.Fatalf("rewind node exited:\n%s", n.out)
		}
		resp, err := op.Latest(ctxT(t), &coordpb.LatestRequest{Job: "nodejob"})
		if err == nil && resp.Step < 6 {
			err = fmt.Errorf("latest %d", resp.Step)
		}
		return err
	})
	if strings.Contains(n.out.String(), "PermissionDenied") || strings.Contains(n.out.String(), "Unauthenticated") {
		t.Fatalf("rewind node was refused a call:\n%s", n.out)
	}
}
