package membership

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// keyedCluster is n members on loopback whose gossip is encrypted with
// key, each reading its own key file (watched every 20 ms).
func keyedCluster(t *testing.T, n int, key []byte) (*testCluster, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{}
	c := startCluster(t, n, nil, func(name string, cfg *Config) {
		files[name] = filepath.Join(dir, name+".keys")
		if err := WriteKeyFile(files[name], [][]byte{key}); err != nil {
			t.Fatal(err)
		}
		cfg.Keys, cfg.KeyFile, cfg.KeyReloadInterval = [][]byte{key}, files[name], 20*time.Millisecond
	})
	return c, files
}

// reachAll waits until every member's pings, encrypted with its primary
// key, are answered by every other.
func (c *testCluster) reachAll(why string) {
	c.t.Helper()
	waitFor(c.t, 20*time.Second, func() string {
		for _, o := range c.names {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			q, err := c.members[o].CheckQuorum(ctx, c.names)
			cancel()
			if err != nil || len(q.Unreached) > 0 {
				return fmt.Sprintf("%s: %s reaches %v, not %v (%v)", why, o, q.Reached, q.Unreached, err)
			}
		}
		return ""
	})
}

// joinWith starts a member named name with keys (none: plaintext) and
// label, and has it join m0.
func (c *testCluster) joinWith(name string, keys [][]byte, label string) (*Members, error) {
	c.t.Helper()
	cfg := testConfig(c.t, name)
	cfg.Keys, cfg.Label = keys, label
	m, err := New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { m.Shutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = m.Join(ctx, c.members["m0"].Local().Addr)
	return m, err
}

// TestGossipKeyRotation rotates the gossip key of three members on
// loopback, one member at a time, through the documented steps: add the
// new key, make it primary, remove the old one. After each member's
// step every member's pings reach every other; nobody is declared dead;
// afterwards a member with the old key alone, with another key, with no
// key or with another label does not join, and one with the new key
// does.
func TestGossipKeyRotation(t *testing.T) {
	oldKey, newKey := NewKey(), NewKey()
	c, files := keyedCluster(t, 3, oldKey)
	c.reachAll("before the rotation")
	steps := []struct {
		name string
		keys [][]byte
	}{
		{"add the new key", [][]byte{oldKey, newKey}},
		{"make it primary", [][]byte{newKey, oldKey}},
		{"remove the old key", [][]byte{newKey}},
	}
	for _, st := range steps {
		for _, n := range c.names {
			if err := WriteKeyFile(files[n], st.keys); err != nil {
				t.Fatal(err)
			}
			m := c.members[n]
			waitFor(t, 10*time.Second, func() string {
				m.keysMu.Lock()
				defer m.keysMu.Unlock()
				if have := m.keyring.GetKeys(); len(have) != len(st.keys) || !bytes.Equal(have[0], st.keys[0]) {
					return fmt.Sprintf("%s: %s holds %d keys", st.name, n, len(have))
				}
				return ""
			})
			c.reachAll(st.name + " on " + n)
		}
	}
	for _, o := range c.names {
		for _, n := range c.names {
			if ev, ok := c.recs[o].first(n, EventDead); ok {
				t.Errorf("%s declared %s dead during the rotation: %+v", o, n, ev)
			}
		}
	}

	for name, tc := range map[string]struct {
		keys  [][]byte
		label string
	}{
		"old key":              {[][]byte{oldKey}, "rewind"},
		"other key":            {[][]byte{NewKey()}, "rewind"},
		"no key":               {nil, "rewind"},
		"new key, other label": {[][]byte{newKey}, "other"},
	} {
		n := "x-" + strings.ReplaceAll(name, " ", "-")
		if _, err := c.joinWith(n, tc.keys, tc.label); err == nil {
			t.Errorf("a member with %s joined", name)
		}
		for _, o := range c.names {
			if _, ok := c.members[o].Member(n); ok {
				t.Errorf("%s sees the member with %s", o, name)
			}
		}
	}
	if _, err := c.joinWith("m3", [][]byte{newKey}, "rewind"); err != nil {
		t.Fatalf("a member with the new key does not join: %v", err)
	}
	c.waitAlive(c.names, []string{"m3"}, 20*time.Second)
	m0 := c.members["m0"]
	if nodes, err := readNodeTable(m0.tr, 5*time.Second, m0.cfg.Label, m0.keyring); err != nil || len(nodes) != 4 {
		t.Fatalf("m0's encrypted node table: %d nodes, %v", len(nodes), err)
	}
}

// TestKeyFile reads key files: the primary first, comments and blank
// lines skipped, bad lines refused with their number.
func TestKeyFile(t *testing.T) {
	k1, k2 := NewKey(), NewKey()
	path := filepath.Join(t.TempDir(), "keys")
	if err := WriteKeyFile(path, [][]byte{k1, k2}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v (%v), want 0600", fi.Mode(), err)
	}
	keys, err := ReadKeyFile(path)
	if err != nil || len(keys) != 2 || !bytes.Equal(keys[0], k1) || !bytes.Equal(keys[1], k2) {
		t.Fatalf("read %d keys (%v)", len(keys), err)
	}
	for name, tc := range map[string]struct{ text, err string }{
		"comments":   {"# rotated 2026-11\n\n" + string(FormatKeys([][]byte{k2})), ""},
		"empty":      {"# nothing\n", "no key"},
		"not base64": {"not a key!\n", "line 1 is not base64"},
		"short":      {"\nAAAA\n", "line 2: a key of 3 bytes"},
		"repeated":   {string(FormatKeys([][]byte{k1, k1})), "line 2 repeats"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseKeys([]byte(tc.text))
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("got %v, want %q", err, tc.err)
			}
		})
	}
}
