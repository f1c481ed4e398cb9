package clock

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestSleep runs in a synctest bubble: its clock moves only when every
// goroutine in it is blocked, so the durations are exact and the test
// waits for nothing.
func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		if err := Sleep(context.Background(), 20*time.Millisecond); err != nil || time.Since(t0) != 20*time.Millisecond {
			t.Fatalf("Sleep(20ms) = %v after %v", err, time.Since(t0))
		}
		cause := errors.New("stopped")
		ctx, cancel := context.WithCancelCause(context.Background())
		go func() { time.Sleep(10 * time.Millisecond); cancel(cause) }() // the cancellation, 10 ms into the Sleep below
		t0 = time.Now()
		if err := Sleep(ctx, time.Hour); !errors.Is(err, cause) || time.Since(t0) != 10*time.Millisecond {
			t.Fatalf("Sleep(1h) cancelled after 10ms = %v after %v, want the cause at once", err, time.Since(t0))
		}
		if err := Sleep(ctx, 0); !errors.Is(err, cause) {
			t.Fatalf("Sleep(0) on an ended ctx = %v", err)
		}
		if err := Sleep(context.Background(), -time.Second); err != nil {
			t.Fatalf("Sleep(-1s) = %v", err)
		}
	})
}
