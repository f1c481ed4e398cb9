package agent_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// nobody is the uid and gid the other user's processes run as.
const nobody = 65534

// TestShmRootPrivateToTheAgent: the shm root becomes the agent's alone
// (0700, even where an older agent left it open to all), its segments
// 0600, both owned by the agent's uid; a process of another uid can
// neither list the root nor read a segment or the slot states, though the
// directory above the root is open to all, as /dev/shm is.
func TestShmRootPrivateToTheAgent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skipf("running a process under another uid needs root; the test runs as uid %d", os.Geteuid())
	}
	cfg := testcluster.AgentConfig(t)
	if err := os.Chmod(filepath.Dir(cfg.ShmRoot), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(cfg.ShmRoot, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(cfg.ShmRoot, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	r := testcluster.StartAgent(t, cfg)
	s, err := r.Dial(t).Session("private", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("weights!")
	if err := s.Save(context.Background(), 1, []sdk.Tensor{{Name: "w", DType: shm.U8, Shape: []int64{8}, Data: data}}, nil); err != nil {
		t.Fatal(err)
	}
	paths := shm.Paths{Root: cfg.ShmRoot}
	segment := paths.Segment("private", 0, 0)
	for path, want := range map[string]os.FileMode{
		cfg.ShmRoot:                   0o700,
		paths.RankDir("private", 0):   0o700,
		segment:                       0o600,
		paths.SlotsFile("private", 0): 0o600,
		filepath.Dir(paths.RankDir("private", 0)): 0o700,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want || int(fi.Sys().(*syscall.Stat_t).Uid) != os.Geteuid() {
			t.Errorf("%s: mode %v uid %d, want %v owned by the agent's uid %d", path, fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Uid, want, os.Geteuid())
		}
	}
	for name, argv := range map[string][]string{
		"list the root":       {"ls", cfg.ShmRoot},
		"read a segment":      {"cat", segment},
		"read slot states":    {"cat", paths.SlotsFile("private", 0)},
		"write into the root": {"touch", filepath.Join(cfg.ShmRoot, "x")},
	} {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "Permission denied") || strings.Contains(string(out), string(data)) {
			t.Errorf("uid %d could %s (%v): %v: %s", nobody, name, argv, err, out)
		}
	}
}
