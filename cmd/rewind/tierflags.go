package main

import (
	"flag"
	"fmt"
	"strings"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/tiers"
	"rewind.dev/rewind/vfs"
)

// tierFlags are an agent's durable tiers: where each one lives and how to
// reach the object store. Credentials come from the environment
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) or a
// shared-credentials file, never from a flag, which any user of the node
// could read in the process list.
type tierFlags struct {
	urls      map[string]string
	s3        tiers.S3Config
	bandwidth string
	faults    *faultinject.Injector // nil: fault injection off
}

func (t *tierFlags) register(fs *flag.FlagSet) {
	t.urls = map[string]string{}
	t.s3 = tiers.DefaultS3Config()
	fs.Func("tier", "a durable tier, NAME=URL, repeatable: nvme=file:///mnt/nvme/rewind, pfs=file:///shared/rewind, s3=s3://bucket/prefix", func(v string) error {
		name, url, ok := strings.Cut(v, "=")
		if !ok || name == "" || url == "" {
			return fmt.Errorf("want NAME=URL, e.g. nvme=file:///mnt/nvme/rewind")
		}
		if _, dup := t.urls[name]; dup {
			return fmt.Errorf("tier %s given twice", name)
		}
		t.urls[name] = url
		return nil
	})
	fs.StringVar(&t.s3.Endpoint, "s3-endpoint", t.s3.Endpoint, "S3 endpoint host[:port]; http:// or https:// sets the scheme")
	fs.StringVar(&t.s3.Region, "s3-region", t.s3.Region, "S3 region")
	fs.StringVar(&t.s3.CredentialsFile, "s3-credentials-file", "", "AWS shared-credentials file (default: the AWS_* environment variables)")
	fs.StringVar(&t.s3.CredentialsProfile, "s3-profile", "", "section of --s3-credentials-file (default: default)")
	fs.StringVar(&t.bandwidth, "transfer-bandwidth", "0", "cap on the bytes per second of all tier transfers of the node, e.g. 500MB (0: none)")
}

// stores opens the tiers named by the flags.
func (t *tierFlags) stores() (map[tiers.Name]tiers.Store, int64, error) {
	bw, err := units.ParseBytes(t.bandwidth)
	if err != nil {
		return nil, 0, fmt.Errorf("--transfer-bandwidth: %w", err)
	}
	out := map[tiers.Name]tiers.Store{}
	for name, url := range t.urls {
		tier, err := tiers.ParseName(name)
		if err != nil {
			return nil, 0, fmt.Errorf("--tier %s: %w", name, err)
		}
		s3 := t.s3
		if t.faults != nil {
			s3.Transport = t.faults.Transport(s3.Transport)
		}
		st, err := tiers.OpenFS(tier, url, s3, t.faults.FS(vfs.Default, "tier"))
		if err != nil {
			return nil, 0, fmt.Errorf("--tier %s: %w", name, err)
		}
		out[tier] = st
	}
	return out, int64(bw), nil
}
