package tiers

import (
	"bytes"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
)

// s3ReplaceTransport replaces the object (through another store) just
// before each of the first `times` ranged GETs goes out, so that the GET,
// pinned to the ETag the Get saw, meets a newer version: what a Put
// completing in the middle of a Get does, made deterministic.
type s3ReplaceTransport struct {
	t        *testing.T
	writer   *S3Store
	name     string
	versions [][]byte
	times    int64        // replacements to make; negative: every ranged GET
	ranged   atomic.Int64 // ranged GETs seen
}

func (r *s3ReplaceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodGet && req.Header.Get("Range") != "" {
		if n := r.ranged.Add(1); r.times < 0 || n <= r.times {
			v := r.versions[n%int64(len(r.versions))]
			if err := r.writer.Put(req.Context(), r.name, bytes.NewReader(v), int64(len(v))); err != nil {
				r.t.Errorf("replacing %s: %v", r.name, err)
			}
		}
	}
	return http.DefaultTransport.RoundTrip(req)
}

// TestS3GetReadsReplacedObjectAgain: an object replaced under every read
// of a Get, more times in a row than a handful, is read again until a
// read sees one version whole, and that version is returned; an object
// replaced under every read gives up at MaxAttempts reads with an error
// saying so, not a mix of versions and not an endless loop.
func TestS3GetReadsReplacedObjectAgain(t *testing.T) {
	const name, size = "x", 1000 // one range: one ranged GET per read
	versions := [][]byte{s3Rand(20, size), s3Rand(21, size), s3Rand(22, size)}
	for _, tc := range []struct {
		what        string
		times       int64
		maxAttempts int
	}{
		{"replaced under the first 6 reads", 6, 10},
		{"replaced under every read", -1, 4},
	} {
		t.Run(tc.what, func(t *testing.T) {
			rt := &s3ReplaceTransport{t: t, name: name, versions: versions, times: tc.times}
			s, srv := newS3(t, func(c *S3Config) { c.Transport, c.MaxAttempts = rt, tc.maxAttempts })
			rt.writer = newS3On(t, srv, nil)
			if err := rt.writer.Put(t.Context(), name, bytes.NewReader(versions[0]), size); err != nil {
				t.Fatal(err)
			}
			var w s3Buf
			n, err := s.Get(t.Context(), name, &w)
			reads := rt.ranged.Load()
			if tc.times >= 0 {
				last := versions[tc.times%int64(len(versions))]
				if err != nil || n != size || !bytes.Equal(w.b, last) || reads != tc.times+1 {
					t.Fatalf("Get: %d bytes, %v, the last version %v, %d reads; want it whole after %d reads",
						n, err, bytes.Equal(w.b, last), reads, tc.times+1)
				}
				return
			}
			var se *S3Error
			if !errors.Is(err, errS3Changed) || !errors.As(err, &se) || se.Attempts != tc.maxAttempts || reads != int64(tc.maxAttempts) {
				t.Fatalf("Get of an object replaced under every read: %v after %d reads; want it to give up after %d", err, reads, tc.maxAttempts)
			}
		})
	}
}
