package demo

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/internal/testcluster"
)

// The end-to-end tests run the real binaries, rewind-dev and rewind beside
// it, built once per test binary and removed when the tests end.
func TestMain(m *testing.M) { testcluster.Main(m, nil) }

// rewindBinary builds cmd/rewind-dev and cmd/rewind into one directory
// and returns rewind-dev's path, or skips the test where it cannot run.
func rewindBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end demo skipped in -short mode")
	}
	if fi, err := os.Stat("/dev/shm"); err != nil || !fi.IsDir() {
		t.Skip("no /dev/shm on this host")
	}
	testcluster.Binary(t, testcluster.RewindPackage) // beside rewind-dev, which runs it
	return testcluster.Binary(t, "rewind.dev/rewind/cmd/rewind-dev")
}

// testSeed returns the seed of a randomized end-to-end test: $REWIND_DEMO_SEED
// to replay one, else a new one, logged.
func testSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())>>1 | 1
	if s := os.Getenv("REWIND_DEMO_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("REWIND_DEMO_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay: REWIND_DEMO_SEED=%d go test -run '%s' ./internal/demo)", seed, seed, t.Name())
	return seed
}

// smallConfig is a demo small enough for a test: 4 MiB of state, 12
// steps of 50 ms, the trainer killed after step 3 to 5.
func smallConfig(exe string, seed uint64, out *bytes.Buffer) Config {
	cfg := DefaultConfig()
	cfg.Exe, cfg.Seed, cfg.Out = exe, seed, out
	cfg.Steps, cfg.Size, cfg.StepTime = 12, 4<<20, 50*time.Millisecond
	cfg.KillMin, cfg.KillMax = 3, 5
	return cfg
}

// wantChecks are the checks every passing demo reports.
var wantChecks = []string{
	"run 1 starts from scratch",
	"after the trainer's SIGKILL, the new run resumes at the right step",
	"after the trainer's SIGKILL, the new run resumes with the same state",
	"after the agent's SIGKILL, the new run resumes at the right step",
	"after the agent's SIGKILL, the new run resumes with the same state",
	"the last run trains to step 12 and exits 0",
	"the final digest equals the uninterrupted run's",
	"every reported digest equals the uninterrupted run's at the same step",
}

// assertPassed checks a demo's output: every check passed, and the
// directories it made are gone.
func assertPassed(t *testing.T, out string) {
	t.Helper()
	for _, c := range wantChecks {
		if !strings.Contains(out, "  ✓ "+c+"\n") {
			t.Errorf("summary lacks ✓ %q", c)
		}
	}
	if strings.Contains(out, "✗") {
		t.Error("a check failed")
	}
	if !strings.Contains(out, "all 8 checks passed") {
		t.Error("no 'all 8 checks passed'")
	}
	for _, re := range []string{`shm root (\S+),`, `socket (\S+)/agent\.sock`} {
		m := regexp.MustCompile(re).FindStringSubmatch(out)
		if m == nil {
			t.Errorf("output names no %s", re)
			continue
		}
		if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
			t.Errorf("%s is still there after the demo (stat: %v)", m[1], err)
		}
	}
}

// TestDemoBinary runs `rewind-dev demo` as `make demo` does, with small
// settings, and checks that it exits 0 with every check passed.
func TestDemoBinary(t *testing.T) {
	exe := rewindBinary(t)
	seed := testSeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "demo", "single", "--steps", "12", "--size", "4MiB", "--step-time", "50ms",
		"--kill-min", "3", "--kill-max", "5", "--seed", strconv.FormatUint(seed, 10))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rewind-dev demo: %v\n%s", err, out)
	}
	assertPassed(t, string(out))
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// TestDemoInProcess runs the demo's own logic in the test process, so the
// race detector watches it, with the agent and trainers as processes.
func TestDemoInProcess(t *testing.T) {
	exe := rewindBinary(t)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := Run(ctx, smallConfig(exe, testSeed(t), &out)); err != nil {
		t.Fatalf("Run: %v\n%s", err, out.String())
	}
	assertPassed(t, out.String())
	if t.Failed() {
		t.Logf("output:\n%s", out.String())
	}
}

// TestDemoDetectsBrokenResume runs the demo with a trainer that flips a
// bit of what it restores: the demo must fail both resume checks and exit
// non-zero.
func TestDemoDetectsBrokenResume(t *testing.T) {
	exe := rewindBinary(t)
	var out bytes.Buffer
	cfg := smallConfig(exe, testSeed(t), &out)
	cfg.TrainerArgs = []string{"--perturb-restore"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := Run(ctx, cfg)
	if err == nil {
		t.Fatalf("Run passed a trainer that corrupts every resume:\n%s", out.String())
	}
	for _, c := range []string{
		"after the trainer's SIGKILL, the new run resumes with the same state",
		"after the agent's SIGKILL, the new run resumes with the same state",
		"the final digest equals the uninterrupted run's",
		"every reported digest equals the uninterrupted run's at the same step",
	} {
		if !strings.Contains(out.String(), "  ✗ "+c+"\n") {
			t.Errorf("summary lacks ✗ %q", c)
		}
	}
	if !strings.Contains(out.String(), "checks FAILED") {
		t.Error("no 'checks FAILED' line")
	}
	if t.Failed() {
		t.Logf("output:\n%s", out.String())
	}
}
