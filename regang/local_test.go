package regang

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// script is a rank's behaviour, chosen by the test per (rank, restore step).
type script map[string]string

func (s script) local(t *testing.T, started *[]string, mu *sync.Mutex) *Local {
	return &Local{
		Command: func(rank, _ uint32, node string, restore int64) *exec.Cmd {
			key := fmt.Sprintf("%d@%d", rank, restore)
			mu.Lock()
			*started = append(*started, key+" on "+node)
			mu.Unlock()
			sh, ok := s[key]
			if !ok {
				t.Errorf("no script for %s", key)
				sh = "exit 1"
			}
			return exec.Command("/bin/sh", "-c", sh)
		},
	}
}

func TestLocalRegangRestartsEveryRank(t *testing.T) {
	var mu sync.Mutex
	var started []string
	l := script{
		"0@-1": "sleep 30", "1@-1": "sleep 30", // the first gang hangs, as in a broken collective
		"0@7": "exit 0", "1@7": "exit 0",
	}.local(t, &started, &mu)
	if err := l.Start(map[uint32]string{0: "a", 1: "b"}, 2, -1); err != nil {
		t.Fatal(err)
	}
	killed := l.KillNode("b")
	if len(killed) != 1 || killed[0] != 1 {
		t.Fatalf("killed on node b: %v", killed)
	}
	if err := l.Regang(context.Background(), &coordpb.JobEvent{Step: 7, Placement: map[uint32]string{0: "a", 1: "a"}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Wait(ctx); err != nil {
		t.Fatalf("wait after the regang: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(started, ", "); got != "0@-1 on a, 1@-1 on b, 0@7 on a, 1@7 on a" {
		t.Fatalf("started: %s", got)
	}
}

func TestLocalWait(t *testing.T) {
	var mu sync.Mutex
	var started []string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A rank told its gang broke is not a failure; another exit status is.
	l := script{"0@-1": fmt.Sprintf("exit %d", ExitGangBroken), "1@-1": "exit 0"}.local(t, &started, &mu)
	if err := l.Start(map[uint32]string{0: "a", 1: "a"}, 2, -1); err != nil {
		t.Fatal(err)
	}
	if err := l.Wait(ctx); err != nil {
		t.Fatalf("a rank leaving a broken gang counted as a failure: %v", err)
	}
	l = script{"0@-1": "exit 2"}.local(t, &started, &mu)
	if err := l.Start(map[uint32]string{0: "a"}, 1, -1); err != nil {
		t.Fatal(err)
	}
	if err := l.Wait(ctx); err == nil || !strings.Contains(err.Error(), "rank 0") {
		t.Fatalf("a rank that failed: %v", err)
	}
}
