package tiers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/minio/minio-go/v7"

	"rewind.dev/rewind/shm"
)

// jobLister is a store that lists the first level of its names without
// listing every object under them: a directory's entries, an object
// store's common prefixes.
type jobLister interface {
	listJobs(ctx context.Context) ([]string, error)
}

// Jobs lists the jobs that have objects on the store, sorted. Names that
// are not valid job ids (a file system's lost+found) are left out. A store
// that cannot list one level has every object listed, so the file and S3
// stores list one level: a job's steps are what Steps lists.
func Jobs(ctx context.Context, st Store) ([]string, error) {
	var names []string
	if jl, ok := st.(jobLister); ok {
		var err error
		if names, err = jl.listJobs(ctx); err != nil {
			return nil, err
		}
	} else {
		all, err := st.List(ctx, "")
		if err != nil {
			return nil, err
		}
		for _, n := range all {
			if job, _, ok := strings.Cut(n, "/"); ok {
				names = append(names, job)
			}
		}
	}
	out := names[:0]
	for _, n := range names {
		if shm.ValidateJob(n) == nil {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// listJobs lists the directories at the store's root.
func (s *FileStore) listJobs(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ents, err := s.fs.ReadDir(s.root)
	if err != nil {
		return nil, fmt.Errorf("tiers: %s: listing jobs: %w", s, err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// listJobs lists the common prefixes under the store's prefix.
func (s *S3Store) listJobs(ctx context.Context) ([]string, error) {
	var names []string
	after := ""
	err := s.retry(ctx, "list", "", s.prefix, func(ctx context.Context) error {
		for obj := range s.core.Client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{
			Prefix:     s.prefix,
			Recursive:  false, // one level: a job's "directory" is a common prefix
			StartAfter: after,
		}) {
			if obj.Err != nil {
				return obj.Err
			}
			after = obj.Key
			if job, ok := strings.CutSuffix(strings.TrimPrefix(obj.Key, s.prefix), "/"); ok && job != "" {
				names = append(names, job)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return names, nil
}
