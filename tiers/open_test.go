package tiers

import (
	"strings"
	"testing"
)

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	s3 := DefaultS3Config()
	s3.Endpoint, s3.AccessKey, s3.SecretKey = "127.0.0.1:9", "ak", "sk"
	for _, tc := range []struct {
		tier           Name
		url, want, err string
	}{
		{tier: "nvme", url: "file://" + dir + "/nvme", want: "file://" + dir + "/nvme"},
		{tier: "pfs", url: "file://" + dir + "/pfs", want: "file://" + dir + "/pfs"},
		{tier: "s3", url: "s3://bucket/prefix", want: "s3://bucket/prefix"},
		{tier: "tape", url: "file://" + dir, err: `unknown tier "tape"`},
		{tier: "nvme", url: "file://host/dir", err: "want file:///absolute/directory"},
		{tier: "nvme", url: "file://", err: "want file:///absolute/directory"},
		{tier: "pfs", url: "/plain/path", err: "want a file:// or s3:// URL"},
		{tier: "s3", url: "s3://user:pw@bucket/x", err: "credentials"},
	} {
		st, err := Open(tc.tier, tc.url, s3)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Open(%s, %s): %v, want an error with %q", tc.tier, tc.url, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Open(%s, %s): %v", tc.tier, tc.url, err)
			continue
		}
		if !strings.Contains(st.String(), tc.want) {
			t.Errorf("Open(%s, %s) is %s, want %s", tc.tier, tc.url, st, tc.want)
		}
	}
	if fs, _ := Open("nvme", "file://"+dir+"/a", s3); fs.(*FileStore).opts.Writers != NVMeOptions().Writers {
		t.Error("nvme tier not tuned for NVMe")
	}
	if fs, _ := Open("pfs", "file://"+dir+"/b", s3); fs.(*FileStore).opts.Writers != PFSOptions().Writers {
		t.Error("pfs tier not tuned for a parallel filesystem")
	}
}
