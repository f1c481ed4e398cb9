package shm_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"rewind.dev/rewind/shm"
)

func TestValidateJob(t *testing.T) {
	cases := map[string]struct {
		job string
		ok  bool
	}{
		"empty":             {"", false},
		"dot":               {".", false},
		"dot dot":           {"..", false},
		"slash":             {"a/b", false},
		"parent":            {"../x", false},
		"absolute":          {"/x", false},
		"backslash":         {`a\b`, false},
		"space":             {"a b", false},
		"trailing space":    {"ab ", false},
		"NUL":               {"a\x00b", false},
		"newline":           {"a\nb", false},
		"leading dash":      {"-rf", false},
		"leading dot":       {".hidden", false},
		"non-ASCII":         {"jöb", false},
		"129 characters":    {strings.Repeat("a", 129), false},
		"128 characters":    {strings.Repeat("a", 128), true},
		"one character":     {"a", true},
		"digit first":       {"7b", true},
		"job-1":             {"job-1", true},
		"llama.70b_run3":    {"llama.70b_run3", true},
		"dots inside":       {"a..b", true},
		"mixed case digits": {"Run_2024-01-01.v2", true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := shm.ValidateJob(tc.job)
			if tc.ok && err != nil {
				t.Errorf("ValidateJob(%q) = %v, want nil", tc.job, err)
			}
			if !tc.ok {
				if err == nil {
					t.Errorf("ValidateJob(%q) accepted it", tc.job)
				} else if !strings.HasPrefix(err.Error(), "shm: ") {
					t.Errorf("error %q does not name its component", err)
				}
			}
			// Whatever is accepted is exactly one path element.
			if err == nil {
				p := shm.Paths{Root: "/r"}.RankDir(tc.job, 0)
				if filepath.Dir(filepath.Dir(p)) != "/r" || filepath.Base(filepath.Dir(p)) != tc.job {
					t.Errorf("accepted job %q gives rank directory %q, outside /r/<job>", tc.job, p)
				}
			}
		})
	}
}

func TestPaths(t *testing.T) {
	p := shm.Paths{Root: "/dev/shm/rewind"}
	if got, want := p.Segment("job-1", 3, 1), "/dev/shm/rewind/job-1/rank-3/slot-1.safetensors"; got != want {
		t.Errorf("Segment = %q, want %q", got, want)
	}
	if got, want := p.SlotsFile("job-1", 4294967295), "/dev/shm/rewind/job-1/rank-4294967295/slots.json"; got != want {
		t.Errorf("SlotsFile = %q, want %q", got, want)
	}
	if got, want := p.RankDir("j", 0), "/dev/shm/rewind/j/rank-0"; got != want {
		t.Errorf("RankDir = %q, want %q", got, want)
	}
}

// TestKubeJobID holds the mapping to the table both SDKs are checked
// against, and checks that every id it makes is a valid job id (the
// NAMESPACE/NAME form it replaces was refused by ValidateJob, so no
// Kubernetes job could ever register).
func TestKubeJobID(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "kube_job_ids"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		ns, name, want := f[0], f[1], f[2]
		got, err := shm.KubeJobID(ns, name)
		if err != nil || got != want {
			t.Errorf("KubeJobID(%q, %q) = %q, %v, want %q", ns, name, got, err, want)
		}
		if err := shm.ValidateJob(got); err != nil {
			t.Errorf("KubeJobID(%q, %q) = %q is not a valid job id: %v", ns, name, got, err)
		}
		n++
	}
	if n < 5 {
		t.Fatalf("only %d cases in testdata/kube_job_ids", n)
	}
}

// TestKubeJobIDDistinct: two different jobs never share an id, however
// their names are chosen: names that look like another's namespace part,
// names at and past the length limit; names Kubernetes refuses (which
// could collide) are refused.
func TestKubeJobIDDistinct(t *testing.T) {
	seen := map[string][2]string{}
	add := func(ns, name string) {
		id, err := shm.KubeJobID(ns, name)
		if err != nil {
			t.Fatalf("KubeJobID(%q, %q): %v", ns, name, err)
		}
		if err := shm.ValidateJob(id); err != nil {
			t.Fatalf("KubeJobID(%q, %q) = %q: %v", ns, name, id, err)
		}
		if prev, ok := seen[id]; ok && prev != [2]string{ns, name} {
			t.Fatalf("%s/%s and %s/%s share job id %q", prev[0], prev[1], ns, name, id)
		}
		seen[id] = [2]string{ns, name}
	}
	for _, ns := range []string{"a", "a-b", "team", strings.Repeat("n", 63), strings.Repeat("n", 62)} {
		for l := 1; l <= 253; l += 3 {
			add(ns, strings.Repeat("x", l))
			if l > 1 {
				add(ns, strings.Repeat("x", l-1)+"y")
			}
			if l <= 251 {
				add(ns, "b."+strings.Repeat("x", l))
			}
		}
	}
	add("a", "b.c")
	add("a-b", "c")
	for name, c := range map[string][2]string{
		"namespace with a dot":   {"a.b", "c"},
		"underscore in the name": {"a", "b_0123456789abcdef"},
		"upper case":             {"a", "Train"},
		"slash":                  {"a", "b/c"},
		"name ends in a dash":    {"a", "b-"},
		"empty namespace":        {"", "b"},
		"namespace over 63":      {strings.Repeat("n", 64), "b"},
		"name over 253":          {"a", strings.Repeat("x", 254)},
	} {
		if id, err := shm.KubeJobID(c[0], c[1]); err == nil {
			t.Errorf("%s: KubeJobID(%q, %q) = %q, want an error", name, c[0], c[1], id)
		}
	}
}
