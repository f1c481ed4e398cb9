package miniotest

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
)

// TestStopStartKeepsData: the server stops (gracefully or killed) and
// starts again on the same port with the same data.
func TestStopStartKeepsData(t *testing.T) {
	s := Start(t)
	ctx := t.Context()
	put := func(key string) {
		t.Helper()
		if _, err := s.Client().PutObject(ctx, s.Bucket, key, strings.NewReader(key), int64(len(key)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(key string) {
		t.Helper()
		obj, err := s.Client().GetObject(ctx, s.Bucket, key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer obj.Close()
		b, err := io.ReadAll(obj)
		if err != nil || !bytes.Equal(b, []byte(key)) {
			t.Fatalf("get %s = %q, %v", key, b, err)
		}
	}
	put("a")
	endpoint := s.Endpoint
	for name, stop := range map[string]func() error{"stop": s.Stop, "kill": s.Kill} {
		if err := stop(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := stop(); err != nil {
			t.Fatalf("%s of a stopped server: %v", name, err)
		}
		if resp, err := http.Get(s.URL() + "/minio/health/live"); err == nil {
			resp.Body.Close()
			t.Fatalf("after %s the server still answers", name)
		}
		if err := s.Start(); err != nil {
			t.Fatalf("start after %s: %v", name, err)
		}
		if s.Endpoint != endpoint {
			t.Fatalf("restarted on %s, was %s", s.Endpoint, endpoint)
		}
		get("a")
		put(name)
		get(name)
	}
	if err := s.Start(); err == nil {
		t.Fatal("starting a running server succeeded")
	}
}

func TestBinaryFromEnv(t *testing.T) {
	t.Setenv(EnvBinary, "/nonexistent/minio")
	if _, err := Binary(); err == nil || !strings.Contains(err.Error(), EnvBinary) {
		t.Fatalf("Binary() = %v, want an error naming $%s", err, EnvBinary)
	}
}

// TestMissingBinary: without the binary a test skips, naming `make
// minio`, unless $REWIND_REQUIRE_MINIO=1 makes it fail.
func TestMissingBinary(t *testing.T) {
	t.Setenv(EnvBinary, "/nonexistent/minio")
	_, err := Binary()
	if err == nil {
		t.Fatal("Binary() found /nonexistent/minio")
	}
	for require, wantFail := range map[string]bool{"": false, "0": false, "1": true} {
		fail, msg := missing(err, require)
		if fail != wantFail {
			t.Errorf("$%s=%q: fail=%v, want %v", EnvRequire, require, fail, wantFail)
		}
		if !strings.Contains(msg, EnvBinary) || !strings.Contains(msg, EnvRequire) || (!fail && !strings.Contains(msg, "make minio")) {
			t.Errorf("$%s=%q: message %q does not say why and what to do", EnvRequire, require, msg)
		}
	}
	t.Run("skips", func(t *testing.T) {
		t.Setenv(EnvRequire, "")
		defer func() {
			if !t.Skipped() {
				t.Error("Start without a binary did not skip")
			}
		}()
		Start(t)
	})
}

// TestLaunchClose: a server for a caller that is not a test serves, and
// Close stops it and removes its data.
func TestLaunchClose(t *testing.T) {
	Require(t)
	parent := t.TempDir()
	s, err := Launch(parent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client().PutObject(t.Context(), s.Bucket, "k", strings.NewReader("v"), 1, minio.PutObjectOptions{}); err != nil {
		s.Close()
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Get(s.URL() + "/minio/health/live"); err == nil {
		resp.Body.Close()
		t.Fatal("after Close the server still answers")
	}
	if left, err := os.ReadDir(parent); err != nil || len(left) != 0 {
		t.Fatalf("Close left %v behind (%v)", left, err)
	}
}
