package wait

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// fakeTB records a Fatalf and ends its goroutine, as testing.T's does.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls body with a fakeTB on a goroutine of its own and returns the
// failure message, "" if none.
func run(body func(tb testing.TB)) string {
	f := &fakeTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		body(f)
	}()
	<-done
	return f.failed
}

// The tests run in synctest bubbles: time moves only when every goroutine
// waits, so a 10 s timeout costs nothing and the polls are exact.

func TestForReturnsOnceTrue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		polls := 0
		msg := run(func(tb testing.TB) {
			For(tb, 10*time.Second, "the third poll", func() bool { polls++; return polls == 3 })
		})
		if msg != "" || polls != 3 || time.Since(start) != 2*Interval {
			t.Fatalf("failed %q after %d polls and %v", msg, polls, time.Since(start))
		}
	})
}

func TestForFailsAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		msg := run(func(tb testing.TB) { For(tb, time.Second, "a thing that never happens", func() bool { return false }) })
		if !strings.Contains(msg, "waited 1s for a thing that never happens") {
			t.Fatalf("failure %q", msg)
		}
		if d := time.Since(start); d < time.Second || d > time.Second+Interval {
			t.Fatalf("failed after %v, want 1s", d)
		}
	})
}

func TestForNilReportsTheLastError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		msg := run(func(tb testing.TB) {
			ForNil(tb, time.Second, "the count", func() error { n++; return fmt.Errorf("count %d", n) })
		})
		if !strings.Contains(msg, "waited 1s for the count; last: count "+fmt.Sprint(n)) {
			t.Fatalf("failure %q after %d polls", msg, n)
		}
	})
}

func TestUntil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		if err := Until(time.Second, func() error { return nil }); err != nil {
			t.Fatal(err)
		}
		no := errors.New("no")
		if err := Until(time.Second, func() error { return no }); err != no {
			t.Fatalf("Until = %v, want the condition's error", err)
		}
	})
}

func TestHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		polls := 0
		if msg := run(func(tb testing.TB) {
			Holds(tb, time.Second, "a property", func() error { polls++; return nil })
		}); msg != "" || time.Since(start) != time.Second || polls < 100 {
			t.Fatalf("a property that holds: failed %q after %v, %d polls", msg, time.Since(start), polls)
		}
		start = time.Now()
		msg := run(func(tb testing.TB) {
			Holds(tb, time.Second, "a property", func() error {
				if time.Since(start) >= 300*time.Millisecond {
					return errors.New("broken")
				}
				return nil
			})
		})
		if !strings.Contains(msg, "a property stopped holding after 300ms of 1s: broken") || time.Since(start) != 300*time.Millisecond {
			t.Fatalf("a property broken at 300ms: %q after %v", msg, time.Since(start))
		}
	})
}
