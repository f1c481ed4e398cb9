package tiers

import (
	"fmt"
	"net/url"

	"rewind.dev/rewind/vfs"
)

// Open returns the store a URL names, for a tier:
//
//	file:///mnt/nvme/rewind    a directory (NVMe tuning for tier nvme, parallel-filesystem tuning otherwise)
//	s3://bucket/prefix         an object store; s3 supplies the endpoint, credentials and tuning
//
// The store is checked for reachability by its first use, not here, so an
// agent starts while an object store is down (its tier shows degraded).
func Open(tier Name, rawURL string, s3 S3Config) (Store, error) {
	return OpenFS(tier, rawURL, s3, nil)
}

// OpenFS is Open with the file system of a file:// tier (nil: the
// operating system's), which fault injection wraps.
func OpenFS(tier Name, rawURL string, s3 S3Config, fsys vfs.FS) (Store, error) {
	if _, err := ParseName(string(tier)); err != nil {
		return nil, err
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("tiers: tier %s: %w", tier, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" || u.Path == "" || u.User != nil || u.RawQuery != "" {
			return nil, fmt.Errorf("tiers: tier %s: %q: want file:///absolute/directory", tier, rawURL)
		}
		opts := PFSOptions()
		if tier.NodeLocal() {
			opts = NVMeOptions()
		}
		opts.FS = fsys
		return NewFileStore(u.Path, opts)
	case "s3":
		s3.URL = rawURL
		return NewS3Store(s3)
	default:
		return nil, fmt.Errorf("tiers: tier %s: %q: want a file:// or s3:// URL", tier, rawURL)
	}
}
