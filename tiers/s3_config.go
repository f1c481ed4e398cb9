package tiers

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7/pkg/s3utils"

	"rewind.dev/rewind/internal/clock"
)

// S3Config configures an S3Store. The credentials never appear in logs,
// errors or String(): they are Secrets, which format as "[redacted]".
type S3Config struct {
	// URL names the bucket and the key prefix: "s3://bucket/prefix".
	// Credentials in the URL are refused.
	URL string
	// Endpoint is host[:port] of the S3 API ("s3.amazonaws.com",
	// "127.0.0.1:9000"). A scheme, when given ("http://minio:9000"), sets
	// Secure.
	Endpoint string
	// Region is the bucket's region; it is sent with every request, so no
	// bucket-location lookup is made.
	Region string
	// Secure selects HTTPS.
	Secure bool

	// The credentials come from the first source that is set: AccessKey
	// and SecretKey; the AWS shared-credentials file CredentialsFile
	// (section CredentialsProfile); the environment (AWS_ACCESS_KEY_ID,
	// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN).
	AccessKey          Secret
	SecretKey          Secret
	SessionToken       Secret
	CredentialsFile    string
	CredentialsProfile string

	// PartSize is the size of one multipart-upload part and of one ranged
	// GET. It bounds the bytes one request carries; with Parallel it bounds
	// what is in flight. At least 5 MiB (the S3 minimum part size).
	PartSize int64
	// Parallel is how many parts (or ranges) one Put (or Get) moves at once.
	Parallel int

	// MaxAttempts bounds the attempts of one request (a part, a range, a
	// stat); RetryTimeout bounds the time one request keeps retrying.
	// Between attempts the store waits RetryBase, doubling up to RetryMax,
	// with jitter.
	MaxAttempts  int
	RetryBase    time.Duration
	RetryMax     time.Duration
	RetryTimeout time.Duration
	// RequestTimeout bounds one attempt of one request, so that a stuck
	// connection becomes a retry instead of a hang.
	RequestTimeout time.Duration

	// OnRetry, when set, is called before the store waits to retry a
	// transient failure (so a caller can show the tier as degraded). It is
	// called from the goroutines moving parts, possibly at once, and must
	// not block.
	OnRetry func(op, name string, attempt int, err error)
	// Transport carries the HTTP requests; nil means minio-go's default.
	// Fault injection wraps it.
	Transport http.RoundTripper
	Clock     clock.Clock
	Logger    *slog.Logger
}

// DefaultS3Config returns the tuning for checkpoint shards of hundreds of
// MiB to tens of GiB; URL, Endpoint and credentials are left to the caller.
func DefaultS3Config() S3Config {
	return S3Config{
		Endpoint:       "s3.amazonaws.com",
		Region:         "us-east-1", // MinIO's default region, and AWS's oldest
		Secure:         true,
		PartSize:       64 << 20,               // large enough that per-request overhead is noise, small enough to retry cheaply
		Parallel:       4,                      // four streams fill a 10-25 Gb/s link; 4 x 64 MiB in flight at most
		MaxAttempts:    10,                     // with RetryMax, rides out a server restart of a minute
		RetryBase:      200 * time.Millisecond, // a dropped connection usually succeeds on the first retry
		RetryMax:       10 * time.Second,       // a restarting server gets polled, not hammered
		RetryTimeout:   2 * time.Minute,        // after this the tier is down, not flaky: fail and let the caller mark it degraded
		RequestTimeout: 2 * time.Minute,        // a 64 MiB part at 1 MB/s; anything slower is a stuck connection
		Clock:          clock.Real,             // tests pass a fake one
		Logger:         slog.Default(),         // the process's; a caller with a logger of its own sets it
	}
}

const s3MinPartSize = 5 << 20 // S3's smallest part (all but the last)

// Validate reports what is wrong with the configuration; it changes
// nothing.
func (c S3Config) Validate() error {
	var errs []error
	if _, _, err := parseS3URL(c.URL); err != nil {
		errs = append(errs, err)
	}
	if _, _, err := parseS3Endpoint(c.Endpoint, c.Secure); err != nil {
		errs = append(errs, err)
	}
	if c.PartSize < s3MinPartSize {
		errs = append(errs, fmt.Errorf("part size %d bytes is below the S3 minimum of 5 MiB", c.PartSize))
	}
	if c.PartSize > 5<<30 {
		errs = append(errs, fmt.Errorf("part size %d bytes is above the S3 maximum of 5 GiB", c.PartSize))
	}
	if c.Parallel < 1 {
		errs = append(errs, fmt.Errorf("parallel is %d, must be at least 1", c.Parallel))
	}
	if c.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("max attempts is %d, must be at least 1", c.MaxAttempts))
	}
	if c.RetryBase <= 0 || c.RetryMax < c.RetryBase {
		errs = append(errs, fmt.Errorf("retry backoff %v..%v: base must be positive and at most max", c.RetryBase, c.RetryMax))
	}
	if c.RetryTimeout <= 0 {
		errs = append(errs, fmt.Errorf("retry timeout %v must be positive", c.RetryTimeout))
	}
	if c.RequestTimeout <= 0 {
		errs = append(errs, fmt.Errorf("request timeout %v must be positive", c.RequestTimeout))
	}
	if (c.AccessKey == "") != (c.SecretKey == "") {
		errs = append(errs, errors.New("access key and secret key must be given together"))
	}
	if c.Clock == nil || c.Logger == nil {
		errs = append(errs, errors.New("clock and logger must be set (DefaultS3Config sets both)"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tiers: invalid s3 config: %w", err)
	}
	return nil
}

// Secret is a credential: it formats, logs and marshals as "[redacted]".
type Secret string

const redactedSecret = "[redacted]"

func (Secret) String() string                  { return redactedSecret }
func (Secret) GoString() string                { return redactedSecret }
func (Secret) LogValue() slog.Value            { return slog.StringValue(redactedSecret) }
func (Secret) MarshalText() ([]byte, error)    { return []byte(redactedSecret), nil }
func (s Secret) reveal() string                { return string(s) }
func (s Secret) isSet() bool                   { return s != "" }
func (Secret) Format(f fmt.State, verb rune)   { _, _ = f.Write([]byte(redactedSecret)) }
func (s *Secret) UnmarshalText(b []byte) error { *s = Secret(b); return nil }

// parseS3URL splits "s3://bucket/prefix" into the bucket and a key prefix
// that is empty or ends in "/". Errors never repeat the URL, which might
// carry credentials.
func parseS3URL(raw string) (bucket, prefix string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", errors.New("url is not a valid URL: want s3://bucket/prefix")
	}
	if u.User != nil {
		return "", "", errors.New("url carries credentials: give them in the config, the environment or a credentials file, never in the URL")
	}
	if u.Scheme != "s3" {
		return "", "", fmt.Errorf("url scheme %q: want s3://bucket/prefix", u.Scheme)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", "", errors.New("url has a query, fragment or opaque part: want s3://bucket/prefix")
	}
	if err := s3utils.CheckValidBucketNameStrict(u.Host); err != nil {
		return "", "", fmt.Errorf("url bucket %q: %v", u.Host, err)
	}
	p := strings.Trim(u.Path, "/")
	if p != "" && !fs.ValidPath(p) {
		return "", "", fmt.Errorf("url prefix %q is not a clean slash-separated path", p)
	}
	if p != "" {
		p += "/"
	}
	return u.Host, p, nil
}

// parseS3Endpoint returns host[:port] and whether to use TLS.
func parseS3Endpoint(raw string, secure bool) (string, bool, error) {
	if raw == "" {
		return "", false, errors.New("endpoint is empty")
	}
	if !strings.Contains(raw, "://") {
		raw = "s3://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", false, errors.New("endpoint is not host[:port] or http(s)://host[:port]")
	}
	if u.User != nil {
		return "", false, errors.New("endpoint carries credentials: give them in the config, the environment or a credentials file")
	}
	if strings.Trim(u.Path, "/") != "" || u.RawQuery != "" {
		return "", false, fmt.Errorf("endpoint %s has a path or query: want host[:port]", u.Host)
	}
	switch u.Scheme {
	case "s3":
	case "http":
		secure = false
	case "https":
		secure = true
	default:
		return "", false, fmt.Errorf("endpoint scheme %q: want http or https", u.Scheme)
	}
	return u.Host, secure, nil
}

// s3Credentials resolves the credentials from the first source set.
func (c *S3Config) s3Credentials() (access, secret, token Secret, err error) {
	switch {
	case c.AccessKey.isSet():
		return c.AccessKey, c.SecretKey, c.SessionToken, nil
	case c.CredentialsFile != "":
		return readCredentialsFile(c.CredentialsFile, c.CredentialsProfile)
	case os.Getenv("AWS_ACCESS_KEY_ID") != "" || os.Getenv("AWS_SECRET_ACCESS_KEY") != "":
		access, secret = Secret(os.Getenv("AWS_ACCESS_KEY_ID")), Secret(os.Getenv("AWS_SECRET_ACCESS_KEY"))
		if !access.isSet() || !secret.isSet() {
			return "", "", "", errors.New("tiers: s3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must both be set")
		}
		return access, secret, Secret(os.Getenv("AWS_SESSION_TOKEN")), nil
	}
	return "", "", "", errors.New("tiers: s3 credentials: none given (set the access and secret key, a credentials file, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
}

// readCredentialsFile reads an AWS shared-credentials file:
//
//	[default]
//	aws_access_key_id = ...
//	aws_secret_access_key = ...
//	aws_session_token = ...   (optional)
//
// Errors name the file, the section and the key, never a value.
func readCredentialsFile(path, profile string) (access, secret, token Secret, err error) {
	if profile == "" {
		profile = "default"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", "", fmt.Errorf("tiers: s3 credentials file: %w", err)
	}
	section, found := "", false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' && line[len(line)-1] == ']' {
			section = strings.TrimSpace(strings.TrimPrefix(strings.Trim(line, "[]"), "profile "))
			found = found || section == profile
			continue
		}
		if section != profile {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "aws_access_key_id":
			access = Secret(strings.TrimSpace(v))
		case "aws_secret_access_key":
			secret = Secret(strings.TrimSpace(v))
		case "aws_session_token":
			token = Secret(strings.TrimSpace(v))
		}
	}
	if !found {
		return "", "", "", fmt.Errorf("tiers: s3 credentials file %s: no section [%s]", path, profile)
	}
	if !access.isSet() || !secret.isSet() {
		return "", "", "", fmt.Errorf("tiers: s3 credentials file %s: section [%s] needs aws_access_key_id and aws_secret_access_key", path, profile)
	}
	return access, secret, token, nil
}
