package testcluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// built holds the binaries Binary built in this test binary, by package;
// Main removes them when the tests end.
var built struct {
	mu   sync.Mutex
	dir  string
	bins map[string]result
}

type result struct {
	path string
	err  error
	out  []byte
}

// RewindPackage is the package of the rewind binary.
const RewindPackage = "rewind.dev/rewind/cmd/rewind"

// Binary builds the command in package pkg once per test binary and
// returns its path; it skips t where there is no go command to build
// with. The binary is removed when the tests end (Main).
func Binary(t testing.TB, pkg string) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("testcluster: no go command on PATH to build %s with", pkg)
	}
	built.mu.Lock()
	defer built.mu.Unlock()
	r, ok := built.bins[pkg]
	if !ok {
		if built.dir == "" {
			if built.dir, err = os.MkdirTemp("", "rewind-test-bin-"); err != nil {
				t.Fatal(err)
			}
		}
		r.path = filepath.Join(built.dir, filepath.Base(pkg))
		cmd := exec.Command(goTool, "build", "-o", r.path, pkg)
		// Static, as make builds every binary but the race detector's:
		// under go test -race (cgo on) a cgo build would compile every
		// dependency once more.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		r.out, r.err = cmd.CombinedOutput()
		if built.bins == nil {
			built.bins = map[string]result{}
		}
		built.bins[pkg] = r
	}
	if r.err != nil {
		t.Fatalf("testcluster: go build %s: %v\n%s", pkg, r.err, r.out)
	}
	return r.path
}

// removeBuilt removes what Binary built.
func removeBuilt() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}
