package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFlagErrorsAreOneLine: a wrong flag or argument, to any command, is
// refused before anything runs with one line that names the flag and what
// is wrong and points at -h; nothing else is printed (not the 20 to 50
// lines of every flag). -h prints the flags and is not an error.
func TestFlagErrorsAreOneLine(t *testing.T) {
	dir := t.TempDir()
	// Flags that would otherwise let a coordinator start are harmless
	// here: its store in a temporary directory, no listener it could keep.
	coord := []string{"--data=" + filepath.Join(dir, "c"), "--listen=127.0.0.1:0", "--metrics=", "--gossip="}
	for name, tc := range map[string]struct {
		run  func(context.Context, []string) error
		args []string
		want []string
	}{
		"negative leave grace": {runCoordinator, append(coord, "--leave-grace", "-5s"), []string{`"-5s"`, "-leave-grace", "must not be negative"}},
		"zero agent timeout":   {runCoordinator, append(coord, "--agent-timeout=0s"), []string{"-agent-timeout", "must be positive"}},
		"empty policy clauses": {runCoordinator, append(coord, "--policy", ";;;"), []string{"-policy", "empty"}},
		"unknown agent flag":   {runAgent, []string{"--bogus"}, []string{"-bogus", "not defined"}},
		"bad step":             {runRestore, []string{"--step", "x", "j"}, []string{"-step"}},
		"missing arguments":    {runVerify, []string{"j"}, []string{"need JOB and STEP"}},
		"bad node flag":        {runNode, []string{"--world-size=-1", "--", "--coordinator=x"}, []string{"-world-size"}},
	} {
		t.Run(name, func(t *testing.T) {
			printed, err := captureAll(t, tc.run, tc.args...)
			if err == nil {
				t.Fatalf("rewind %v: accepted", tc.args)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error spans lines:\n%s", msg)
			}
			for _, w := range append(tc.want, "-h lists the flags") {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
			if printed != "" {
				t.Errorf("printed besides the error (%d lines):\n%s", strings.Count(printed, "\n"), printed)
			}
		})
	}
	printed, err := captureAll(t, runCoordinator, "-h")
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(printed, "usage: rewind coordinator") || !strings.Contains(printed, "-leave-grace") {
		t.Fatalf("-h: %v\n%s", err, printed)
	}
}

// captureAll runs a command with a cancelled context (a command that
// wrongly starts returns at once) and returns what it printed to stdout
// and stderr.
func captureAll(t *testing.T, run func(context.Context, []string) error, args ...string) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = w, w
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, args); w.Close() }()
	out, _ := io.ReadAll(r)
	// The command's error before the files go back: it is what orders
	// the command's last use of os.Stderr before this write.
	err = <-errc
	os.Stdout, os.Stderr = oldOut, oldErr
	return string(out), err
}
