package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestTierFlags(t *testing.T) {
	dir := t.TempDir()
	parse := func(args ...string) (*tierFlags, error) {
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var tf tierFlags
		tf.register(fs)
		return &tf, fs.Parse(args)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "ak")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "sk-do-not-print")
	tf, err := parse("--tier", "nvme=file://"+dir+"/nvme", "--tier", "pfs=file://"+dir+"/pfs", "--tier", "s3=s3://bucket/ckpt",
		"--s3-endpoint", "http://127.0.0.1:9000", "--transfer-bandwidth", "500MB")
	if err != nil {
		t.Fatal(err)
	}
	stores, bw, err := tf.stores()
	if err != nil {
		t.Fatal(err)
	}
	if len(stores) != 3 || bw != 500_000_000 {
		t.Fatalf("stores %v, bandwidth %d", stores, bw)
	}
	for name, st := range stores {
		if strings.Contains(st.String(), "sk-do-not-print") {
			t.Fatalf("tier %s shows its secret: %s", name, st)
		}
	}
	for _, bad := range [][]string{
		{"--tier", "nvme"},
		{"--tier", "nvme=file:///a", "--tier", "nvme=file:///b"},
	} {
		if _, err := parse(bad...); err == nil {
			t.Errorf("flags %v accepted", bad)
		}
	}
	tf, _ = parse("--tier", "tape=file:///x")
	if _, _, err := tf.stores(); err == nil || !strings.Contains(err.Error(), "unknown tier") {
		t.Errorf("unknown tier: %v", err)
	}
	tf, _ = parse("--transfer-bandwidth", "lots")
	if _, _, err := tf.stores(); err == nil || !strings.Contains(err.Error(), "--transfer-bandwidth") {
		t.Errorf("bad bandwidth: %v", err)
	}
}
