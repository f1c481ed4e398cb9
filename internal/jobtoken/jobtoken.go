// Package jobtoken mints and checks the per-job tokens that let a rank use
// its own job's checkpoints on a node, and no other job's.
//
// A job's token is derived from a key and the job id: HMAC-SHA256 of the
// id under the key. Whoever holds the key (the coordinator, each agent,
// the node supervisor and the Kubernetes controller: the trusted daemons)
// mints the token of any job, and an agent checks a token with no state
// and no call to anyone. A rank holds its own job's token only.
//
// A key file holds one key per line, base64 (standard, padded) of 32
// random bytes; the first line mints, every line checks, so a key is
// rotated by adding a new first line, handing out new tokens, and then
// dropping the old line.
package jobtoken

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"
)

// KeyBytes is the size of a key.
const KeyBytes = 32

// prefix starts every token: its version, and a mark that tells a token
// from other strings in logs and files.
const prefix = "rwj1."

// Keys mint and check tokens. The zero value has no key: it mints nothing
// and checks nothing (see Enabled).
type Keys struct {
	keys [][]byte
}

// New returns the keys of the given raw keys, the first minting.
func New(keys ...[]byte) (Keys, error) {
	if len(keys) == 0 {
		return Keys{}, errors.New("jobtoken: no key")
	}
	for i, k := range keys {
		if len(k) < KeyBytes {
			return Keys{}, fmt.Errorf("jobtoken: key %d is %d bytes, at least %d are needed", i+1, len(k), KeyBytes)
		}
	}
	return Keys{keys: keys}, nil
}

// Generate returns a new random key, encoded as a key file's line.
func Generate() string {
	k := make([]byte, KeyBytes)
	if _, err := rand.Read(k); err != nil {
		panic(err)
	}
	return base64.StdEncoding.EncodeToString(k)
}

// WriteFile writes a new key file holding one new key, readable by its
// owner only. It refuses to replace an existing file.
func WriteFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("jobtoken: %w", err)
	}
	_, err = f.WriteString(Generate() + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("jobtoken: writing %s: %w", path, err)
	}
	return nil
}

// Load reads a key file (see the package comment).
func Load(path string) (Keys, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Keys{}, fmt.Errorf("jobtoken: key file: %w", err)
	}
	return Parse(b, path)
}

// Parse decodes a key file's contents; name says where they came from.
func Parse(b []byte, name string) (Keys, error) {
	var keys [][]byte
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return Keys{}, fmt.Errorf("jobtoken: %s line %d is not base64: %v", name, i+1, err)
		}
		keys = append(keys, k)
	}
	ks, err := New(keys...)
	if err != nil {
		return Keys{}, fmt.Errorf("%w (in %s)", err, name)
	}
	return ks, nil
}

// Enabled says whether there is a key.
func (k Keys) Enabled() bool { return len(k.keys) > 0 }

// Token returns job's token under the minting key; "" without a key.
func (k Keys) Token(job string) string {
	if !k.Enabled() {
		return ""
	}
	return prefix + base64.RawURLEncoding.EncodeToString(sum(k.keys[0], job))
}

// Errors of Check, for errors.Is.
var (
	ErrNoToken    = errors.New("no job token")
	ErrWrongToken = errors.New("wrong job token")
)

// Check returns nil when token is job's under one of the keys, ErrNoToken
// when token is empty and ErrWrongToken otherwise (another job's, a
// retired key's, garbage); it never says which part of a token is wrong.
func (k Keys) Check(job, token string) error {
	if token == "" {
		return ErrNoToken
	}
	raw, ok := strings.CutPrefix(token, prefix)
	if !ok {
		return ErrWrongToken
	}
	mac, err := base64.RawURLEncoding.DecodeString(raw)
	if err != nil || len(mac) != sha256.Size {
		return ErrWrongToken
	}
	for _, key := range k.keys {
		if hmac.Equal(mac, sum(key, job)) {
			return nil
		}
	}
	return ErrWrongToken
}

// domain separates these MACs from any other use of the key.
var domain = []byte("rewind job token\x00")

func sum(key []byte, job string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(domain)
	h.Write([]byte(job))
	return h.Sum(nil)
}
