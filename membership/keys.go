package membership

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// Gossip encryption. Every gossip message and state exchange is encrypted
// and authenticated with AES-GCM (memberlist's keyring) under the
// primary key and the cluster's label; a member accepts what any key of
// its keyring opens. So keys rotate with no member declared dead: add the
// new key everywhere, then make it primary everywhere, then remove the
// old one everywhere (docs/operations.md).

// KeyFileName is the gossip key file's name in a daemon's certificate
// directory, where `rewind certs` writes it and the daemons look for it.
const KeyFileName = "gossip.keys"

// ReadKeyFile reads a gossip key file: one key a line, base64 (standard
// encoding) of 16, 24 or 32 random bytes (AES-128, -192 or -256); the
// first is the primary, which encrypts; every key decrypts. Blank lines
// and lines starting with # are skipped.
func ReadKeyFile(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("membership: gossip keys: %w", err)
	}
	keys, err := ParseKeys(b)
	if err != nil {
		return nil, fmt.Errorf("membership: gossip keys %s: %w", path, err)
	}
	return keys, nil
}

// ParseKeys parses a key file's contents (ReadKeyFile).
func ParseKeys(b []byte) ([][]byte, error) {
	var keys [][]byte
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return nil, fmt.Errorf("line %d is not base64: %w", i+1, err)
		}
		if err := memberlist.ValidateKey(k); err != nil {
			return nil, fmt.Errorf("line %d: a key of %d bytes; want 16, 24 or 32", i+1, len(k))
		}
		for _, o := range keys {
			if bytes.Equal(o, k) {
				return nil, fmt.Errorf("line %d repeats a key", i+1)
			}
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no key")
	}
	return keys, nil
}

// NewKey returns a new random AES-256 gossip key.
func NewKey() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k) // crypto/rand.Read never fails (Go 1.24)
	return k
}

// FormatKeys is a key file's contents: one base64 key a line, the
// primary first.
func FormatKeys(keys [][]byte) []byte {
	var b bytes.Buffer
	for _, k := range keys {
		b.WriteString(base64.StdEncoding.EncodeToString(k))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// WriteKeyFile writes keys to path (mode 0600), replacing it by a rename
// so that a member reading it sees the old file or the new one.
func WriteKeyFile(path string, keys [][]byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".gossip-keys-*")
	if err != nil {
		return fmt.Errorf("membership: writing gossip keys: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(FormatKeys(keys))
	if err = errors.Join(err, tmp.Chmod(0o600), tmp.Close()); err != nil {
		return fmt.Errorf("membership: writing gossip keys: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("membership: writing gossip keys: %w", err)
	}
	return nil
}

// keyring builds memberlist's keyring from keys (nil: none, plaintext).
func keyring(keys [][]byte) (*memberlist.Keyring, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	kr, err := memberlist.NewKeyring(keys, keys[0])
	if err != nil {
		return nil, fmt.Errorf("membership: gossip keys: %w", err)
	}
	return kr, nil
}

// ReloadKeys reads Config.KeyFile again and makes the keyring what it
// says: its new keys added, its first key primary, keys it no longer
// lists removed. It returns whether anything changed. A file that cannot
// be read or parsed changes nothing.
func (m *Members) ReloadKeys() (bool, error) {
	if m.cfg.KeyFile == "" || m.keyring == nil {
		return false, nil
	}
	keys, err := ReadKeyFile(m.cfg.KeyFile)
	if err != nil {
		return false, err
	}
	m.keysMu.Lock()
	defer m.keysMu.Unlock()
	kr := m.keyring
	have := kr.GetKeys()
	changed := false
	for _, k := range keys {
		if !containsKey(have, k) {
			if err := kr.AddKey(k); err != nil {
				return changed, fmt.Errorf("membership: gossip keys: %w", err)
			}
			changed = true
		}
	}
	if !bytes.Equal(kr.GetPrimaryKey(), keys[0]) {
		if err := kr.UseKey(keys[0]); err != nil {
			return changed, fmt.Errorf("membership: gossip keys: %w", err)
		}
		changed = true
	}
	for _, k := range have {
		if !containsKey(keys, k) {
			if err := kr.RemoveKey(k); err != nil {
				return changed, fmt.Errorf("membership: gossip keys: %w", err)
			}
			changed = true
		}
	}
	if changed {
		m.met.keyReloads.Inc()
		m.log.Info("gossip keys reloaded", "keys", len(keys))
	}
	return changed, nil
}

func containsKey(keys [][]byte, k []byte) bool {
	for _, o := range keys {
		if bytes.Equal(o, k) {
			return true
		}
	}
	return false
}

// watchKeys reloads the key file when its contents change, every
// KeyReloadInterval (a Kubernetes Secret volume swaps a symbolic link,
// which reading follows).
func (m *Members) watchKeys() {
	last, _ := os.ReadFile(m.cfg.KeyFile)
	t := time.NewTicker(m.cfg.KeyReloadInterval)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-t.C:
		}
		b, err := os.ReadFile(m.cfg.KeyFile)
		if err != nil || bytes.Equal(b, last) {
			continue
		}
		if _, err := m.ReloadKeys(); err != nil {
			m.log.Error("gossip keys not reloaded; the keys in use stay", "err", err)
			continue
		}
		last = b
	}
}
