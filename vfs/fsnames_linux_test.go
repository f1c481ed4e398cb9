package vfs

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestStatfsNamesFileSystems: Statfs names a file system as mount(8)
// does, not by its magic number alone, and marks the kernel's pseudo file
// systems (proc, sysfs), on which nothing may be stored.
func TestStatfsNamesFileSystems(t *testing.T) {
	for magic, want := range map[int64]string{unix.EXT4_SUPER_MAGIC: "ext4", unix.XFS_SUPER_MAGIC: "xfs",
		unix.OVERLAYFS_SUPER_MAGIC: "overlay", unix.TMPFS_MAGIC: "tmpfs", unix.BTRFS_SUPER_MAGIC: "btrfs", unix.NFS_SUPER_MAGIC: "nfs"} {
		if got := fsNames[magic].name; got != want {
			t.Errorf("magic 0x%x: %q, want %q", magic, got, want)
		}
	}
	for path, want := range map[string]struct {
		name          string
		tmpfs, pseudo bool
	}{
		"/proc":    {"proc", false, true},
		"/sys":     {"sysfs", false, true},
		"/dev/shm": {"tmpfs", true, false},
	} {
		st, err := Default.Statfs(path)
		if err != nil {
			t.Logf("%s: %v (not on this host)", path, err)
			continue
		}
		if st.Type != want.name || st.Tmpfs != want.tmpfs || st.Pseudo != want.pseudo {
			t.Errorf("Statfs(%s) = %+v, want %s, tmpfs %v, pseudo %v", path, st, want.name, want.tmpfs, want.pseudo)
		}
	}
	wd, _ := os.Getwd()
	st, err := Default.Statfs(wd)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(st.Type, "0x") || st.Magic == 0 {
		t.Errorf("Statfs(%s) = %+v: the type is a bare number", wd, st)
	}
}
