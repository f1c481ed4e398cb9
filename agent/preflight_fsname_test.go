package agent_test

import (
	"strings"
	"testing"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/vfs"
)

// TestNotOnTmpfsNamesTheFileSystem: a shm root on a disk is refused with
// the file system's name (ext4, xfs, overlay, ...), not only its magic
// number.
func TestNotOnTmpfsNamesTheFileSystem(t *testing.T) {
	dir := t.TempDir()
	st, err := vfs.Default.Statfs(dir)
	if err != nil || st.Tmpfs {
		t.Skipf("the test's temporary directory is on tmpfs here (%v)", err)
	}
	cfg := testcluster.AgentConfig(t)
	cfg.ShmRoot = dir
	_, err = agent.New(cfg)
	if err == nil || !strings.Contains(err.Error(), "is on "+st.Type+", not tmpfs") || strings.Contains(err.Error(), "on a 0x") {
		t.Fatalf("agent.New with its root on %s = %v; want the file system named", st.Type, err)
	}
	t.Log(err)
}
