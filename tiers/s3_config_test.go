package tiers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/miniotest"
)

func TestS3CredentialsNeverShown(t *testing.T) {
	srv := miniotest.Start(t)
	var logs bytes.Buffer
	s := newS3On(t, srv, func(c *S3Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.RetryTimeout = 300 * time.Millisecond
	})
	secrets := []string{srv.SecretKey, srv.AccessKey}
	check := func(what, text string) {
		t.Helper()
		for _, sec := range secrets {
			if strings.Contains(text, sec) {
				t.Errorf("%s shows a credential: %s", what, text)
			}
		}
	}
	check("String()", s.String())
	if want := "s3://rewind-test/ckpt/ at " + srv.URL(); s.String() != want {
		t.Errorf("String() = %q, want %q", s.String(), want)
	}
	cfg := s.cfg
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		check("config formatted with "+f, fmt.Sprintf(f, cfg))
	}
	cfg.Logger.Info("config", "cfg", cfg, "key", cfg.SecretKey)
	check("log", logs.String())

	// Wrong secret: the server refuses, the store does not retry, the
	// error names the place and not the keys.
	badCfg := cfg
	badCfg.SecretKey = "wrong-" + cfg.SecretKey
	bad, err := NewS3Store(badCfg)
	if err != nil {
		t.Fatal(err)
	}
	err = bad.Put(t.Context(), "x", bytes.NewReader([]byte("x")), 1)
	if err == nil {
		t.Fatal("Put with a wrong secret succeeded")
	}
	var se *S3Error
	if !errors.As(err, &se) || se.Attempts != 1 {
		t.Errorf("an authentication failure was retried: %v", err)
	}
	secrets = append(secrets, "wrong-"+srv.SecretKey)
	check("auth error", err.Error())
	check("auth error %#v", fmt.Sprintf("%#v", err))

	// Server down: retried, then an error without the keys.
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	_, err = s.Size(t.Context(), "x")
	if err == nil {
		t.Fatal("Size with the server down succeeded")
	}
	check("connection error", err.Error())
	check("log", logs.String())
	if !strings.Contains(logs.String(), "retrying") {
		t.Errorf("no retry was logged: %s", logs.String())
	}
}

func TestS3Config(t *testing.T) {
	type tc struct {
		edit    func(*S3Config)
		wantErr string // "" means valid
	}
	run := func(t *testing.T, tc tc) {
		cfg := DefaultS3Config()
		cfg.URL, cfg.Endpoint, cfg.AccessKey, cfg.SecretKey = "s3://bucket/pre/fix", "127.0.0.1:9000", "AKID", "SEKRET"
		tc.edit(&cfg)
		err := cfg.Validate()
		if tc.wantErr == "" {
			if err != nil {
				t.Fatal(err)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
		}
		if strings.Contains(err.Error(), "SEKRET") || strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("error shows a credential: %v", err)
		}
	}
	for name, c := range map[string]tc{
		"defaults":            {edit: func(*S3Config) {}},
		"bucket only":         {edit: func(c *S3Config) { c.URL = "s3://bucket" }},
		"http endpoint":       {edit: func(c *S3Config) { c.Endpoint = "http://minio:9000" }},
		"not s3":              {edit: func(c *S3Config) { c.URL = "file:///tmp" }, wantErr: "scheme"},
		"credentials in URL":  {edit: func(c *S3Config) { c.URL = "s3://AKID:hunter2@bucket/p" }, wantErr: "never in the URL"},
		"credentials in host": {edit: func(c *S3Config) { c.Endpoint = "http://AKID:hunter2@minio:9000" }, wantErr: "endpoint carries credentials"},
		"bad bucket":          {edit: func(c *S3Config) { c.URL = "s3://B_/p" }, wantErr: "bucket"},
		"dotdot prefix":       {edit: func(c *S3Config) { c.URL = "s3://bucket/a/../b" }, wantErr: "prefix"},
		"no endpoint":         {edit: func(c *S3Config) { c.Endpoint = "" }, wantErr: "endpoint is empty"},
		"endpoint path":       {edit: func(c *S3Config) { c.Endpoint = "minio:9000/x" }, wantErr: "path"},
		"small parts":         {edit: func(c *S3Config) { c.PartSize = 1 << 20 }, wantErr: "5 MiB"},
		"no parallel":         {edit: func(c *S3Config) { c.Parallel = 0 }, wantErr: "parallel"},
		"no attempts":         {edit: func(c *S3Config) { c.MaxAttempts = 0 }, wantErr: "attempts"},
		"backoff":             {edit: func(c *S3Config) { c.RetryMax = c.RetryBase / 2 }, wantErr: "backoff"},
		"half credentials":    {edit: func(c *S3Config) { c.SecretKey = "" }, wantErr: "together"},
		"no logger":           {edit: func(c *S3Config) { c.Logger = nil }, wantErr: "clock and logger must be set"},
	} {
		t.Run(name, func(t *testing.T) { run(t, c) })
	}
}

func TestS3ConfigParsing(t *testing.T) {
	for raw, want := range map[string][2]string{
		"s3://bkt":        {"bkt", ""},
		"s3://bkt/":       {"bkt", ""},
		"s3://bkt/p":      {"bkt", "p/"},
		"s3://bkt/p/q/":   {"bkt", "p/q/"},
		"s3://my.bucket/": {"my.bucket", ""},
	} {
		b, p, err := parseS3URL(raw)
		if err != nil || b != want[0] || p != want[1] {
			t.Errorf("parseS3URL(%q) = %q, %q, %v; want %q, %q", raw, b, p, err, want[0], want[1])
		}
	}
	for raw, want := range map[string]struct {
		host   string
		secure bool
	}{
		"minio:9000":         {"minio:9000", true},
		"http://minio:9000":  {"minio:9000", false},
		"https://s3.aws.com": {"s3.aws.com", true},
	} {
		h, sec, err := parseS3Endpoint(raw, true)
		if err != nil || h != want.host || sec != want.secure {
			t.Errorf("parseS3Endpoint(%q) = %q, %v, %v", raw, h, sec, err)
		}
	}
}

func TestS3CredentialSources(t *testing.T) {
	base := func() S3Config {
		c := DefaultS3Config()
		c.URL, c.Endpoint = "s3://bucket", "127.0.0.1:1"
		return c
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	t.Setenv("AWS_SESSION_TOKEN", "")

	c := base()
	if _, err := NewS3Store(c); err == nil || !strings.Contains(err.Error(), "none given") {
		t.Errorf("no credentials: %v", err)
	}

	t.Setenv("AWS_ACCESS_KEY_ID", "envid")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
	a, sk, _, err := c.s3Credentials()
	if err != nil || a.reveal() != "envid" || sk.reveal() != "envsecret" {
		t.Errorf("from env: %v", err)
	}

	path := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(path, []byte("# comment\n[default]\naws_access_key_id = fileid\naws_secret_access_key=filesecret\n\n[profile other]\naws_access_key_id = oid\naws_secret_access_key = osecret\naws_session_token = otoken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.CredentialsFile = path
	if a, sk, _, err := c.s3Credentials(); err != nil || a.reveal() != "fileid" || sk.reveal() != "filesecret" {
		t.Errorf("from file, default profile: %v", err)
	}
	c.CredentialsProfile = "other"
	if a, sk, tok, err := c.s3Credentials(); err != nil || a.reveal() != "oid" || sk.reveal() != "osecret" || tok.reveal() != "otoken" {
		t.Errorf("from file, profile other: %v", err)
	}
	c.CredentialsProfile = "missing"
	if _, _, _, err := c.s3Credentials(); err == nil || !strings.Contains(err.Error(), "no section [missing]") {
		t.Errorf("missing profile: %v", err)
	}
	c.AccessKey, c.SecretKey = "cfgid", "cfgsecret"
	if a, _, _, err := c.s3Credentials(); err != nil || a.reveal() != "cfgid" {
		t.Errorf("the config's keys come first: %v", err)
	}
	c = base()
	c.CredentialsFile = filepath.Join(t.TempDir(), "nope")
	if _, err := NewS3Store(c); err == nil || !strings.Contains(err.Error(), "credentials file") {
		t.Errorf("missing file: %v", err)
	}
}

// TestS3Retrier steps a fake clock instead of sleeping.
func TestS3Retrier(t *testing.T) {
	transient := minio.ErrorResponse{StatusCode: 503, Code: "ServiceUnavailable"}
	permanent := minio.ErrorResponse{StatusCode: 403, Code: "AccessDenied"}
	type tc struct {
		errs         []error // returned by successive attempts; nil after
		maxAttempts  int
		retryTimeout time.Duration
		wantAttempts int // 0: as many as the time allows
		wantErr      error
	}
	run := func(t *testing.T, tc tc) {
		fake := clock.NewFake(time.Unix(0, 0))
		cfg := DefaultS3Config()
		cfg.Clock, cfg.Logger = fake, slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg.RetryBase, cfg.RetryMax = 100*time.Millisecond, time.Second
		cfg.MaxAttempts, cfg.RetryTimeout = tc.maxAttempts, tc.retryTimeout
		var waits []time.Duration
		r := s3Retrier{cfg: &cfg, sleep: func(_ context.Context, d time.Duration) error {
			waits = append(waits, d)
			fake.Step(d)
			return nil
		}}
		calls := 0
		n, _, err := r.do(t.Context(), "put", "x", func(context.Context) error {
			calls++
			if calls <= len(tc.errs) {
				return tc.errs[calls-1]
			}
			return nil
		})
		if calls != n || !errors.Is(err, tc.wantErr) {
			t.Fatalf("do = %d attempts (%d calls), %v; want %v", n, calls, err, tc.wantErr)
		}
		if tc.wantAttempts > 0 && n != tc.wantAttempts {
			t.Fatalf("do made %d attempts, want %d", n, tc.wantAttempts)
		}
		if total := fake.Now().Sub(time.Unix(0, 0)); total > tc.retryTimeout || (tc.wantAttempts == 0 && total < tc.retryTimeout/2) {
			t.Fatalf("do retried for %v (%d attempts); the budget is %v", total, n, tc.retryTimeout)
		}
		for i, w := range waits {
			hi := min(cfg.RetryMax, cfg.RetryBase<<i)
			if w < hi/2 || w > hi {
				t.Errorf("wait %d is %v, want within [%v, %v]", i+1, w, hi/2, hi)
			}
		}
	}
	many := slices.Repeat([]error{transient}, 100)
	for name, c := range map[string]tc{
		"success":               {maxAttempts: 5, retryTimeout: time.Minute, wantAttempts: 1},
		"transient then ok":     {errs: many[:3], maxAttempts: 5, retryTimeout: time.Minute, wantAttempts: 4},
		"attempts run out":      {errs: many, maxAttempts: 5, retryTimeout: time.Minute, wantAttempts: 5, wantErr: transient},
		"time runs out":         {errs: many, maxAttempts: 100, retryTimeout: 3 * time.Second, wantErr: transient}, // attempts vary with the jitter
		"permanent":             {errs: []error{permanent}, maxAttempts: 5, retryTimeout: time.Minute, wantAttempts: 1, wantErr: permanent},
		"source error":          {errs: []error{&s3SourceError{io.ErrUnexpectedEOF}}, maxAttempts: 5, retryTimeout: time.Minute, wantAttempts: 1, wantErr: io.ErrUnexpectedEOF},
		"refused then ok":       {errs: []error{fmt.Errorf("dial: %w", syscall.ECONNREFUSED)}, maxAttempts: 5, retryTimeout: time.Minute, wantAttempts: 2},
		"attempt timeout, then": {errs: []error{context.DeadlineExceeded}, maxAttempts: 5, retryTimeout: time.Minute, wantAttempts: 2},
	} {
		t.Run(name, func(t *testing.T) { run(t, c) })
	}

	t.Run("cancelled while waiting", func(t *testing.T) {
		cfg := DefaultS3Config()
		cfg.Clock, cfg.Logger = clock.Real, slog.New(slog.NewTextHandler(io.Discard, nil))
		ctx, cancel := context.WithCancel(t.Context())
		r := s3Retrier{cfg: &cfg, sleep: func(ctx context.Context, d time.Duration) error {
			cancel()
			return clock.Sleep(ctx, d)
		}}
		_, _, err := r.do(ctx, "put", "x", func(context.Context) error { return transient })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("do = %v, want context.Canceled", err)
		}
	})
}

func TestS3CombineCRC(t *testing.T) {
	data := s3Rand(20, 1<<20+17)
	for _, cuts := range [][]int{{}, {0}, {5}, {1 << 19, 1 << 20}, {1, 2, 3, 1000}} {
		var crcs []uint32
		var sizes []int64
		prev := 0
		for _, c := range append(slices.Clone(cuts), len(data)) {
			crcs = append(crcs, crc32.Checksum(data[prev:c], s3Castagnoli))
			sizes = append(sizes, int64(c-prev))
			prev = c
		}
		got, err := s3CombineCRC(crcs, sizes)
		if want := s3CRCString(crc32.Checksum(data, s3Castagnoli)); err != nil || got != want {
			t.Errorf("cuts %v: s3CombineCRC = %q, %v; want %q", cuts, got, err, want)
		}
	}
}
