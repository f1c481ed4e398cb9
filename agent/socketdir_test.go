package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/internal/testcluster"
)

// TestSocketDirectoryOneLevelOnly: the agent creates the socket's own
// directory when it is missing (as /run/rewind under /run), but never
// walks up creating its parents, and never creates a directory at the
// file system's root: such a --socket fails, naming the directory, and
// leaves nothing behind.
func TestSocketDirectoryOneLevelOnly(t *testing.T) {
	base, err := os.MkdirTemp("", "rw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })

	// One level missing: created, and the agent serves.
	cfg := testcluster.AgentConfig(t)
	cfg.Socket = filepath.Join(base, "run", "a.sock")
	testcluster.StartAgent(t, cfg).Stop()
	if st, err := os.Stat(filepath.Join(base, "run")); err != nil || !st.IsDir() {
		t.Fatalf("socket directory not created: %v", err)
	}

	atRoot := "/rewind-test-" + filepath.Base(base)
	t.Cleanup(func() { os.RemoveAll(atRoot) })
	for name, tc := range map[string]struct {
		socket, mustNotExist, want string
	}{
		"two levels missing": {filepath.Join(base, "x", "y", "a.sock"), filepath.Join(base, "x"), "nor does its parent"},
		"a directory at /":   {filepath.Join(atRoot, "a.sock"), atRoot, "at the file system's root"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := testcluster.AgentConfig(t)
			cfg.Socket = tc.socket
			a, err := agent.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = a.Run(ctx, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run with socket %s = %v, want an error saying %q", tc.socket, err, tc.want)
			}
			if _, serr := os.Stat(tc.mustNotExist); serr == nil {
				t.Errorf("%s was created", tc.mustNotExist)
			}
		})
	}
}
