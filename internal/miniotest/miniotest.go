// Package miniotest runs a real MinIO server for tests and benchmarks: the
// pinned binary that `make minio` builds into the repository's bin/, on a
// free loopback port, with a temporary data directory, random credentials
// and one bucket. A test can stop the server (gracefully or with SIGKILL)
// and start it again on the same port and data, to see what a client does
// meanwhile.
package miniotest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"rewind.dev/rewind/internal/freeport"
)

// EnvBinary, when set, names the MinIO server binary to run instead of
// bin/minio in the repository.
const EnvBinary = "REWIND_MINIO"

// EnvRequire, set to 1, makes a missing MinIO binary fail the tests that
// need it instead of skipping them: `make test` sets it, so CI runs them
// for real, while `go test ./...` on a fresh clone skips them.
const EnvRequire = "REWIND_REQUIRE_MINIO"

// Region is the region the server answers for.
const Region = "us-east-1"

// Server is a running (or stopped) MinIO server. Its methods are safe for
// concurrent use, so a test may stop it from inside a reader callback.
type Server struct {
	Endpoint  string // 127.0.0.1:port
	AccessKey string
	SecretKey string
	Bucket    string // created by Start

	bin, dir string
	ownDir   bool // made by Launch; Close removes it
	logPath  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
}

// Binary returns the path of the MinIO server binary: $REWIND_MINIO,
// minio beside the running executable (bin/rewind finds bin/minio), or
// bin/minio in the repository (found by walking up to go.mod). Its error
// says how to build it.
func Binary() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("miniotest: $%s: %w", EnvBinary, err)
		}
		return p, nil
	}
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), "minio"); isFile(p) {
			return p, nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("miniotest: no go.mod above the working directory, so no repository bin/minio: run `make minio` in the repository")
		}
		dir = parent
	}
	p := filepath.Join(dir, "bin", "minio")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("miniotest: the MinIO server binary %s is missing: run `make minio` (it builds the pinned server into bin/ once, in about 3 minutes)", p)
	}
	return p, nil
}

// Start starts a server with one empty bucket and stops it when the test
// ends. A missing binary skips the test, with a message naming `make
// minio`, unless $REWIND_REQUIRE_MINIO is 1 (as `make test` sets it): then
// it fails the test.
func Start(tb testing.TB) *Server {
	tb.Helper()
	Require(tb)
	s, err := newServer(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Kill(); err != nil {
			tb.Errorf("miniotest: %v", err)
		}
		if tb.Failed() {
			tb.Logf("miniotest: server log (last 4 KiB):\n%s", s.LogTail(4096))
		}
	})
	if err := s.launch(); err != nil {
		tb.Fatal(err)
	}
	return s
}

// Require skips tb, with a message naming `make minio`, when there is no
// MinIO binary; with $REWIND_REQUIRE_MINIO=1 it fails tb instead. Every
// test that needs the binary goes through it (Start calls it).
func Require(tb testing.TB) {
	tb.Helper()
	_, err := Binary()
	if err == nil {
		return
	}
	if fail, msg := missing(err, os.Getenv(EnvRequire)); fail {
		tb.Fatal(msg)
	} else {
		tb.Skip(msg)
	}
}

// missing says what a test does without the binary (err says why it is
// missing), given $REWIND_REQUIRE_MINIO: fail, or skip; and with what
// message.
func missing(err error, require string) (fail bool, msg string) {
	if require == "1" {
		return true, fmt.Sprintf("%v ($%s=1: the tests that need MinIO must run)", err, EnvRequire)
	}
	return false, fmt.Sprintf("%v (skipped: `make minio` builds it; $%s=1 fails instead)", err, EnvRequire)
}

// Launch starts a server with one empty bucket for a caller that is not a
// test (a benchmark): its data lives in a new directory under parent (""
// means the system's temporary directory), and Close stops the server and
// removes that directory.
func Launch(parent string) (*Server, error) {
	dir, err := os.MkdirTemp(parent, "rewind-minio-")
	if err != nil {
		return nil, fmt.Errorf("miniotest: %w", err)
	}
	s, err := newServer(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.ownDir = true
	if err := s.launch(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close kills the server and, for a server from Launch, removes its data.
func (s *Server) Close() error {
	err := s.Kill()
	if s.ownDir {
		err = errors.Join(err, os.RemoveAll(s.dir))
	}
	return err
}

func newServer(dir string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	return &Server{
		bin:       bin,
		dir:       dir,
		logPath:   filepath.Join(dir, "minio.log"),
		AccessKey: "rewind-" + randHex(6),
		SecretKey: randHex(20),
		Bucket:    "rewind-test",
	}, nil
}

// launch starts the server on a free port and creates its bucket.
func (s *Server) launch() error {
	// The port is free when picked, but another process may take it
	// before MinIO binds it: try a few.
	for try := 1; ; try++ {
		addr, err := freeport.Addr()
		if err != nil {
			return fmt.Errorf("miniotest: %w", err)
		}
		s.Endpoint = addr
		if err = s.Start(); err == nil {
			break
		}
		if try == 3 {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Client().MakeBucket(ctx, s.Bucket, minio.MakeBucketOptions{Region: Region}); err != nil {
		return fmt.Errorf("miniotest: make bucket: %w", err)
	}
	return nil
}

// PID returns the server process's id, 0 when it is not running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// URL is the server's base URL.
func (s *Server) URL() string { return "http://" + s.Endpoint }

// Client returns a minio-go client with the server's credentials.
func (s *Server) Client() *minio.Client {
	c, err := minio.New(s.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Region: Region,
	})
	if err != nil {
		panic(err) // only a malformed endpoint fails, and Start made it
	}
	return c
}

// Start starts the server on its port and data directory and waits until
// it serves requests. It is an error to start a running server.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("miniotest: server already running")
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, "server",
		"--address", s.Endpoint,
		"--console-address", "127.0.0.1:0",
		"--certs-dir", filepath.Join(s.dir, "certs"),
		filepath.Join(s.dir, "data"))
	cmd.Env = append(cleanEnv(),
		"MINIO_ROOT_USER="+s.AccessKey,
		"MINIO_ROOT_PASSWORD="+s.SecretKey,
		"MINIO_REGION="+Region,
		"MINIO_BROWSER=off",           // no console
		"MINIO_UPDATE=off",            // never reach out
		"MINIO_CI_CD=on",              // a test machine: no drive or kernel checks
		"MINIO_API_REQUESTS_MAX=1000", // do not size by the machine's memory
		"HOME="+s.dir,
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("miniotest: start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	if err := s.waitReady(done, 60*time.Second); err != nil {
		_ = cmd.Process.Kill()
		<-done
		s.cmd, s.done = nil, nil
		return fmt.Errorf("%w\nlog tail:\n%s", err, s.LogTail(2048))
	}
	return nil
}

// waitReady polls the readiness endpoint until it answers 200.
func (s *Server) waitReady(exited <-chan struct{}, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-exited:
			return fmt.Errorf("miniotest: server on %s exited while starting", s.Endpoint)
		default:
		}
		resp, err := hc.Get(s.URL() + "/minio/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("miniotest: server on %s not ready after %v", s.Endpoint, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the server gracefully (SIGTERM; SIGKILL after 10 s) and
// waits for it to exit. Stopping a stopped server does nothing.
func (s *Server) Stop() error { return s.stop(syscall.SIGTERM, 10*time.Second) }

// Kill stops the server with SIGKILL, as a crash would, and waits for it
// to exit. Killing a stopped server does nothing.
func (s *Server) Kill() error { return s.stop(syscall.SIGKILL, 0) }

func (s *Server) stop(sig syscall.Signal, grace time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	if err := s.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("miniotest: signal server: %w", err)
	}
	if grace > 0 {
		select {
		case <-s.done:
		case <-time.After(grace):
			_ = s.cmd.Process.Kill()
		}
	}
	<-s.done
	s.cmd, s.done = nil, nil
	return nil
}

// LogTail returns the last n bytes of the server's output.
func (s *Server) LogTail(n int) string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// cleanEnv is the environment without MinIO's and AWS's own settings, so a
// developer's shell cannot change the test server.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "MINIO_") || strings.HasPrefix(kv, "AWS_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
