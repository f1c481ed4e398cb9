package child

import (
	"bufio"
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func start(t *testing.T, script string) *Proc {
	t.Helper()
	p, err := Start(exec.Command("/bin/sh", "-c", script))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// A child that ignores SIGTERM is killed once the grace passes, and Stop
// returns only when it is gone.
func TestStopKillsAfterTheGrace(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", `trap "" TERM; echo up; sleep 30`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	// "up" is written once the shell has set its trap.
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "up\n" {
		t.Fatalf("the shell wrote %q, %v; want up", line, err)
	}
	began := time.Now()
	p.Stop(300 * time.Millisecond)
	if !p.Exited() {
		t.Fatal("Stop returned with the process alive")
	}
	if took := time.Since(began); took < 300*time.Millisecond {
		t.Fatalf("Stop returned after %v, before the grace: the TERM was not ignored?", took)
	}
	var exit *exec.ExitError
	if !errors.As(p.Err(), &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("Err = %v, want killed by SIGKILL", p.Err())
	}
}

// A child that honours SIGTERM ends at once, without waiting out the grace.
func TestStopEndsAtTheTerm(t *testing.T) {
	p := start(t, `sleep 30`)
	began := time.Now()
	p.Stop(10 * time.Second)
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("Stop took %v for a process that ends at SIGTERM", took)
	}
}

// A child that exits before it is ready ends Ready at once with how it
// ended, not at the limit.
func TestReadyFailsWhenTheChildExits(t *testing.T) {
	p := start(t, `exit 3`)
	began := time.Now()
	err := p.Ready(context.Background(), time.Minute, func() error { return errors.New("no socket yet") })
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "no socket yet") {
		t.Fatalf("Ready = %v, want ErrExited naming exit status 3 and the last answer", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("Ready took %v to see the exit", took)
	}
}

func TestReadyWaitsForTheAnswer(t *testing.T) {
	p := start(t, `sleep 30`)
	tries := 0
	err := p.Ready(context.Background(), time.Minute, func() error {
		if tries++; tries < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || tries != 3 {
		t.Fatalf("Ready = %v after %d tries, want nil after 3", err, tries)
	}
	if p.Err() != nil || p.Exited() {
		t.Fatalf("a running process: Exited %v, Err %v", p.Exited(), p.Err())
	}
	err = p.Ready(context.Background(), 200*time.Millisecond, func() error { return errors.New("never") })
	if err == nil || errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "not ready within") {
		t.Fatalf("Ready past its limit = %v", err)
	}
}
