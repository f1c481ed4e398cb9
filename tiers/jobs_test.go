package tiers

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestJobsListsOneLevel: Jobs names the jobs with objects on a file store
// and on an object store (one level listed, not every object), leaving
// out what is not a job id, and a job's steps are what Steps lists.
func TestJobsListsOneLevel(t *testing.T) {
	dir := t.TempDir()
	fsStore, err := NewFileStore(dir, PFSOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "lost+found"), 0o750); err != nil {
		t.Fatal(err)
	}
	s3Store, _ := newS3(t, nil)
	for name, st := range map[string]Store{"file": fsStore, "s3": s3Store} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			if jobs, err := Jobs(ctx, st); err != nil || len(jobs) != 0 {
				t.Fatalf("jobs of an empty store: %v %v", jobs, err)
			}
			for _, n := range []string{ShardName("b-job", 3, 0), ShardName("a", 1, 0), ShardName("a", 2, 1), ManifestName("a", 2)} {
				if err := st.Put(ctx, n, bytes.NewReader([]byte("x")), 1); err != nil {
					t.Fatal(err)
				}
			}
			jobs, err := Jobs(ctx, st)
			if err != nil || !slices.Equal(jobs, []string{"a", "b-job"}) {
				t.Fatalf("jobs: %v %v, want [a b-job]", jobs, err)
			}
			if steps, err := Steps(ctx, st, "a"); err != nil || !slices.Equal(steps, []int64{2}) {
				t.Fatalf("steps of a: %v %v, want [2] (the step with a manifest)", steps, err)
			}
		})
	}
}
