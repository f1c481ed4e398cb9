package testcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/transport"
)

// The clusters of a test binary run with mutual TLS, as a real one does:
// one certificate authority per test binary, made on first use, and one
// certificate directory per identity, issued once. Agents started here
// share a node certificate that speaks for any node (transport.AnyNode),
// so that a test names its nodes as it likes; tests of a node kept to
// its own name issue per-node certificates with TLSDir.
//
// REWIND_TEST_PLAINTEXT=1 runs them in plaintext instead (on loopback),
// to tell a failure of TLS from another.
const EnvPlaintext = "REWIND_TEST_PLAINTEXT"

// The identities of a test cluster's members.
var (
	CoordinatorID = transport.Identity{Role: transport.RoleCoordinator, Name: "coordinator"}
	NodeID        = transport.Identity{Role: transport.RoleNode, Name: transport.AnyNode}
	OperatorID    = transport.Identity{Role: transport.RoleOperator, Name: "test-operator"}
	ReaderID      = transport.Identity{Role: transport.RoleReader, Name: "test-reader"}
)

var pki struct {
	mu   sync.Mutex
	dir  string
	ca   *transport.CA
	dirs map[transport.Identity]string
	secs map[transport.Identity]*transport.Security
}

// Plaintext reports whether the test clusters run without TLS
// (REWIND_TEST_PLAINTEXT).
func Plaintext() bool { return os.Getenv(EnvPlaintext) == "1" }

// CA returns the test binary's certificate authority and the directory
// its files are under (removed when the tests end).
func CA(t testing.TB) (*transport.CA, string) {
	t.Helper()
	pki.mu.Lock()
	defer pki.mu.Unlock()
	if err := makeCA(); err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	return pki.ca, pki.dir
}

func makeCA() error {
	if pki.ca != nil {
		return nil
	}
	dir, err := os.MkdirTemp("", "rewind-test-pki-")
	if err != nil {
		return err
	}
	ca, err := transport.NewCA("rewind test CA", 24*time.Hour)
	if err != nil {
		return err
	}
	if err := ca.WriteCA(filepath.Join(dir, "ca")); err != nil {
		return err
	}
	pki.dir, pki.ca = dir, ca
	pki.dirs, pki.secs = map[transport.Identity]string{}, map[transport.Identity]*transport.Security{}
	return nil
}

// TLSDir returns the certificate directory of id, issued by the test
// binary's CA on first use.
func TLSDir(t testing.TB, id transport.Identity) string {
	t.Helper()
	pki.mu.Lock()
	defer pki.mu.Unlock()
	dir, err := tlsDir(id)
	if err != nil {
		t.Fatalf("testcluster: certificate of %s: %v", id, err)
	}
	return dir
}

func tlsDir(id transport.Identity) (string, error) {
	if err := makeCA(); err != nil {
		return "", err
	}
	if d, ok := pki.dirs[id]; ok {
		return d, nil
	}
	d := filepath.Join(pki.dir, id.Role.String(), strings.ReplaceAll(id.Name, transport.AnyNode, "any"))
	if err := pki.ca.IssueDir(d, transport.Leaf{Identity: id, Validity: 24 * time.Hour}); err != nil {
		return "", err
	}
	pki.dirs[id] = d
	return d, nil
}

// TLS returns id's transport security (nil, plaintext on loopback, with
// REWIND_TEST_PLAINTEXT=1).
func TLS(t testing.TB, id transport.Identity) *transport.Security {
	t.Helper()
	if Plaintext() {
		return nil
	}
	dir := TLSDir(t, id)
	pki.mu.Lock()
	defer pki.mu.Unlock()
	if s := pki.secs[id]; s != nil {
		return s
	}
	s, err := transport.Load(dir, Discard())
	if err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	pki.secs[id] = s
	return s
}

// processTLS is the transport of a role's process: the directory its
// spec names, or none.
func processTLS(dir string) (*transport.Security, error) {
	if dir == "" {
		return nil, nil
	}
	return transport.Load(dir, Discard())
}

// specTLSDir is the certificate directory a spawned process of id gets
// when its spec names none: "" with REWIND_TEST_PLAINTEXT=1.
func specTLSDir(t testing.TB, dir string, id transport.Identity) string {
	t.Helper()
	if dir != "" || Plaintext() {
		return dir
	}
	return TLSDir(t, id)
}

// removePKI removes the test binary's certificates.
func removePKI() {
	pki.mu.Lock()
	defer pki.mu.Unlock()
	if pki.dir != "" {
		os.RemoveAll(pki.dir)
	}
}

// DialCoordinatorAs returns a client of the coordinator at addr with
// id's certificate, closed when t ends.
func DialCoordinatorAs(t testing.TB, addr string, id transport.Identity, opts ...grpc.DialOption) coordpb.CoordinatorClient {
	t.Helper()
	conn, err := TLS(t, id).NewClient(addr, transport.ExpectCoordinator, opts...)
	if err != nil {
		t.Fatal(fmt.Errorf("testcluster: %w", err))
	}
	t.Cleanup(func() { conn.Close() })
	return coordpb.NewCoordinatorClient(conn)
}
