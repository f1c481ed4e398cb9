package shm_test

import (
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

func TestBytes(t *testing.T) {
	for n, want := range map[uint64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
		64 << 20: "64.0 MiB", 3 << 29: "1.5 GiB", 1 << 60: "1.0 EiB", 1<<64 - 1: "16.0 EiB",
	} {
		if got := shm.Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
