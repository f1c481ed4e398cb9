package tiers

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileTierDirectoryChecked: a file tier must be a directory the agent
// can store into: one on procfs or sysfs (file:///proc/self), or a path
// that is a file, is refused with why, before the agent starts.
func TestFileTierDirectoryChecked(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for url, want := range map[string]string{
		"file:///proc/self": "is on proc, a kernel pseudo file system",
		"file:///sys":       "is on sysfs, a kernel pseudo file system",
		"file://" + file:    "not a directory",
	} {
		_, err := OpenFS(PFS, url, DefaultS3Config(), nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("OpenFS(pfs, %s) = %v; want an error saying %q", url, err, want)
		}
	}
	if _, err := OpenFS(PFS, "file://"+filepath.Join(t.TempDir(), "pfs"), DefaultS3Config(), nil); err != nil {
		t.Fatalf("a fresh directory: %v", err)
	}
}
