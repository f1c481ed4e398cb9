// Package wait is how a test waits for something to happen: it polls a
// condition until it holds, up to a deadline, and fails the test with a
// message that says what was awaited and what was last seen. A test never
// sleeps for a fixed time in the hope that something has happened by
// then: on a loaded machine it has not, and on an idle one the test waits
// for nothing.
//
// Holds is the one exception, for a property that must stay true over a
// window (a slow member is never declared dead while it is slow): there is
// no event that says "nothing will go wrong from now on", so the window is
// the test's input, and the condition is checked all through it.
package wait

import (
	"errors"
	"testing"
	"time"
)

// Interval is how often a condition is polled.
const Interval = 10 * time.Millisecond

// For polls cond until it returns true. If timeout passes first it fails
// tb: "waited <timeout> for <what>".
func For(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	ForNil(tb, timeout, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

var errNotYet = errors.New("not yet")

// ForNil polls cond until it returns nil. If timeout passes first it fails
// tb with what and cond's last error, which should say what it saw.
func ForNil(tb testing.TB, timeout time.Duration, what string, cond func() error) {
	tb.Helper()
	if err := Until(timeout, cond); err != nil {
		if errors.Is(err, errNotYet) {
			tb.Fatalf("wait: waited %v for %s", timeout, what)
		}
		tb.Fatalf("wait: waited %v for %s; last: %v", timeout, what, err)
	}
}

// Until polls cond until it returns nil and returns nil; if timeout passes
// first it returns cond's last error. It is For and ForNil for a caller
// that does not fail the test itself (a helper that reports what it got).
func Until(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(Interval)
	defer t.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return err
		}
		<-t.C
	}
}

// Holds checks cond every Interval for d and fails tb the first time it
// returns an error, naming what and the error. It is for a property over a
// window (see the package comment), not for waiting.
func Holds(tb testing.TB, d time.Duration, what string, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(d)
	t := time.NewTicker(Interval)
	defer t.Stop()
	for {
		if err := cond(); err != nil {
			tb.Fatalf("wait: %s stopped holding after %v of %v: %v", what, d-time.Until(deadline), d, err)
		}
		if !time.Now().Before(deadline) {
			return
		}
		<-t.C
	}
}
