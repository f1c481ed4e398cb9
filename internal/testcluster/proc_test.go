package testcluster

import (
	"fmt"
	"os"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	Main(m, map[string]Role{
		"hello": func() int {
			for i := range 10000 { // more than a pipe holds: the output is read whatever the test takes
				fmt.Println("hello", os.Getenv("WHO"), i)
			}
			return 3
		},
		"hang": func() int { fmt.Println("ready"); Hang(); return 0 },
	})
}

// TestSpawnRoles: a process in a role gets its environment, its output
// is read line by line, its exit status is seen, and Kill ends one that
// would not end by itself.
func TestSpawnRoles(t *testing.T) {
	p := Spawn(t, "hello", "WHO=world")
	for _, want := range []string{"hello world 0", "hello world 1"} {
		if l := p.NextLine(t, 30*time.Second); l != want {
			t.Fatalf("line %q, want %q", l, want)
		}
	}
	if err := p.Wait(); err == nil || p.Cmd.ProcessState.ExitCode() != 3 || !p.Exited() {
		t.Fatalf("exit %v (%v), want status 3", err, p.Cmd.ProcessState)
	}
	h := Spawn(t, "hang")
	if l := h.NextLine(t, 30*time.Second); l != "ready" {
		t.Fatalf("first line %q", l)
	}
	if h.Exited() {
		t.Fatal("a hanging process exited")
	}
	h.Kill()
	h.Kill() // killing an exited process does nothing
	if !h.Exited() {
		t.Fatal("a killed process has not exited")
	}
}

// TestUnknownRole: a role the test binary does not have is an error
// (exit status 2), never the tests run again in the child.
func TestUnknownRole(t *testing.T) {
	p := Spawn(t, "no-such-role")
	if err := p.Wait(); err == nil || p.Cmd.ProcessState.ExitCode() != 2 {
		t.Fatalf("exit %v, want status 2", err)
	}
}
