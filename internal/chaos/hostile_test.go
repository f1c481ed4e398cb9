package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// lateTimer is a context whose deadline has a timer that has not fired
// yet: what a loaded machine shows between a context's deadline and the
// moment its timer's goroutine runs.
type lateTimer struct {
	context.Context
	end time.Time
}

func (c lateTimer) Deadline() (time.Time, bool) { return c.end, true }

// grpcLike fails at once with DeadlineExceeded when its context's
// deadline has passed, as a gRPC client call does, and is otherwise
// answered after a moment.
func grpcLike(ctx context.Context) error {
	if end, ok := ctx.Deadline(); ok && !time.Now().Before(end) {
		return status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	}
	time.Sleep(20 * time.Millisecond)
	return nil
}

func TestCallRoundsJudgeOnlyCallsMadeInTime(t *testing.T) {
	ctx := lateTimer{Context: context.Background(), end: time.Now().Add(300 * time.Millisecond)}
	calls := on(nil, []call{
		{"a read", false, grpcLike},
		{"a refused call", true, func(ctx context.Context) error {
			if err := grpcLike(ctx); err != nil {
				return err
			}
			return status.Error(codes.InvalidArgument, "refused")
		}},
	})
	made, bad := callRounds(ctx, calls)
	if len(bad) > 0 {
		t.Fatalf("calls made while the attack lasted failed the check: %s", strings.Join(bad, "; "))
	}
	if made == 0 {
		t.Fatal("no call was made")
	}
	if time.Now().Before(ctx.end) {
		t.Fatal("the rounds ended before the context's deadline")
	}
}

func TestCallRoundsReportACallNotAnswered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	calls := on(nil, []call{
		{"a refused call", true, func(context.Context) error { return status.Error(codes.Unavailable, "connection refused") }},
		{"a read", false, func(context.Context) error { return status.Error(codes.NotFound, "gone") }},
		{"a call that must be refused", true, func(context.Context) error { return nil }},
	})
	made, bad := callRounds(ctx, calls)
	want := []string{"a refused call: not answered", "a read: rpc error: code = NotFound desc = gone", "a call that must be refused: accepted"}
	if made != 3 || len(bad) != len(want) {
		t.Fatalf("made %d calls, failed %q; want 3 calls, one round, each failed", made, bad)
	}
	for i, w := range want {
		if !strings.HasPrefix(bad[i], w) {
			t.Errorf("failure %d is %q, want it to begin %q", i, bad[i], w)
		}
	}
}
