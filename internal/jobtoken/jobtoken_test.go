package jobtoken_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"rewind.dev/rewind/internal/jobtoken"
)

func keys(t *testing.T, lines ...string) jobtoken.Keys {
	t.Helper()
	k, err := jobtoken.Parse([]byte(strings.Join(lines, "\n")), "test")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestTokenIsTheJobsOnly(t *testing.T) {
	k := keys(t, jobtoken.Generate())
	a := k.Token("ns.job-a")
	if err := k.Check("ns.job-a", a); err != nil {
		t.Fatalf("job A's token for job A: %v", err)
	}
	for name, tc := range map[string]struct {
		job, token string
		want       error
	}{
		"another job's":     {"ns.job-b", a, jobtoken.ErrWrongToken},
		"none":              {"ns.job-a", "", jobtoken.ErrNoToken},
		"another key's":     {"ns.job-a", keys(t, jobtoken.Generate()).Token("ns.job-a"), jobtoken.ErrWrongToken},
		"truncated":         {"ns.job-a", a[:len(a)-1], jobtoken.ErrWrongToken},
		"without prefix":    {"ns.job-a", strings.TrimPrefix(a, "rwj1."), jobtoken.ErrWrongToken},
		"a prefix of a job": {"ns.job-a2", a, jobtoken.ErrWrongToken},
	} {
		t.Run(name, func(t *testing.T) {
			if err := k.Check(tc.job, tc.token); !errors.Is(err, tc.want) {
				t.Fatalf("Check(%q, %q) = %v, want %v", tc.job, tc.token, err, tc.want)
			}
		})
	}
}

// TestRotation: with a new key first and the old one second, both the
// old and the new tokens check and new tokens are minted with the new
// key; once the old line is dropped, old tokens are refused.
func TestRotation(t *testing.T) {
	old, next := jobtoken.Generate(), jobtoken.Generate()
	before := keys(t, old).Token("j")
	during := keys(t, next, old)
	if err := during.Check("j", before); err != nil {
		t.Fatalf("old token during rotation: %v", err)
	}
	after := keys(t, next)
	if tok := during.Token("j"); tok != after.Token("j") || tok == before {
		t.Fatal("during rotation, tokens are not minted with the new key")
	}
	if err := after.Check("j", before); !errors.Is(err, jobtoken.ErrWrongToken) {
		t.Fatalf("old token after rotation: %v, want refused", err)
	}
}

func TestKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if err := jobtoken.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", fi.Mode(), err)
	}
	if err := jobtoken.WriteFile(path); err == nil {
		t.Fatal("a second WriteFile replaced the key")
	}
	k, err := jobtoken.Load(path)
	if err != nil || !k.Enabled() {
		t.Fatalf("Load: %v", err)
	}
	for name, contents := range map[string]string{
		"empty":     "",
		"short key": "c2hvcnQ=",
		"not b64":   "!!!",
	} {
		if _, err := jobtoken.Parse([]byte(contents), name); err == nil {
			t.Errorf("%s key file accepted", name)
		}
	}
}
