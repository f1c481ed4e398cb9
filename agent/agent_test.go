package agent_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/internal/segsock"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/vfs"
)

type preflightCase struct {
	mod     func(t *testing.T, cfg *agent.Config)
	wantErr string // empty: the agent starts
}

func TestPreflight(t *testing.T) {
	cases := map[string]preflightCase{
		"defaults on /dev/shm": {},
		"root not on tmpfs": {
			mod: func(t *testing.T, cfg *agent.Config) {
				dir := t.TempDir()
				if st, err := vfs.Default.Statfs(dir); err != nil || st.Tmpfs {
					t.Skipf("the test's temporary directory is on tmpfs here (%v)", err)
				}
				cfg.ShmRoot = dir
			},
			wantErr: "not tmpfs",
		},
		"budget above the tmpfs size": {
			mod:     func(t *testing.T, cfg *agent.Config) { cfg.BudgetBytes = 1 << 50 },
			wantErr: "exceeds the",
		},
		"one slot per rank": {
			mod:     func(t *testing.T, cfg *agent.Config) { cfg.SlotsPerRank = 1 },
			wantErr: "at least 2",
		},
		"root cannot be created": {
			mod:     func(t *testing.T, cfg *agent.Config) { cfg.ShmRoot = "/proc/rewind-cannot-exist/shm" },
			wantErr: "cannot create shm root",
		},
		"no node name": {
			mod:     func(t *testing.T, cfg *agent.Config) { cfg.Node = "" },
			wantErr: "node name is empty",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) { runPreflight(t, tc) })
	}
}

func runPreflight(t *testing.T, tc preflightCase) {
	cfg := testcluster.AgentConfig(t)
	if tc.mod != nil {
		tc.mod(t, &cfg)
	}
	_, err := agent.New(cfg)
	switch {
	case tc.wantErr == "" && err != nil:
		t.Fatalf("agent refused to start: %v", err)
	case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
		t.Fatalf("agent.New: %v, want an error saying %q", err, tc.wantErr)
	}
}

func TestSecondAgentOnSameSocketRefused(t *testing.T) {
	cfg := testcluster.AgentConfig(t)
	testcluster.StartAgent(t, cfg)
	cfg2 := testcluster.AgentConfig(t)
	cfg2.Socket = cfg.Socket
	a, err := agent.New(cfg2)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Run(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "another agent") {
		t.Fatalf("second agent on a live socket: %v", err)
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	cfg := testcluster.AgentConfig(t)
	if err := os.WriteFile(cfg.Socket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	testcluster.StartAgent(t, cfg)
}

func TestSocketGroupMode(t *testing.T) {
	cfg := testcluster.AgentConfig(t)
	cfg.SocketGroup = "0"
	testcluster.StartAgent(t, cfg)
	for _, path := range []string{cfg.Socket, segsock.Path(cfg.Socket)} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o660 {
			t.Fatalf("socket %s mode with a group: %v, want 0660", path, fi.Mode().Perm())
		}
	}
	// The group reaches the sockets, never the segments.
	if fi, err := os.Stat(cfg.ShmRoot); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("shm root with a socket group: %v, %v; want 0700", fi.Mode(), err)
	}
}

// TestReindexIgnoresStrangers checks that files under the root that the
// agent did not write are neither served nor fatal.
func TestReindexIgnoresStrangers(t *testing.T) {
	cfg := testcluster.AgentConfig(t)
	for _, p := range []string{"not a job!/x", "job/rank-x/slot-0.safetensors", "job/rank-0/slot-0.safetensors", "job/rank-0/slots.json"} {
		path := filepath.Join(cfg.ShmRoot, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := testcluster.StartAgent(t, cfg)
	for _, sh := range r.Agent.List("") {
		t.Fatalf("agent serves a shard it never committed: %+v", sh)
	}
	if used, _ := r.Agent.Used(); used != uint64(len("garbage")) {
		t.Fatalf("used %d bytes, want the stray segment's 7 counted", used)
	}
}

func TestDelete(t *testing.T) {
	r := testcluster.StartAgent(t, testcluster.AgentConfig(t))
	a := r.Agent
	ctx := context.Background()
	// Prepare without commit leaves a writing slot, which Delete keeps.
	if _, err := a.Prepare(ctx, "del", 0, 1, 1, 8192); err != nil {
		t.Fatal(err)
	}
	if n, _, err := a.Delete("del", 0, true, -1); err != nil || n != 0 {
		t.Fatalf("delete of a job with only a save in progress: %d, %v", n, err)
	}
	if _, _, err := a.Delete("../x", 0, true, -1); !errors.Is(err, agent.ErrInvalid) {
		t.Fatalf("delete of a bad job name: %v", err)
	}
}
