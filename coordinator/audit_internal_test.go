package coordinator

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/transport"
)

// auditCoordinator is a coordinator on dir whose audit log keeps max
// entries for keep, on a fake clock.
func auditCoordinator(t *testing.T, dir string, clk clock.Clock, max int, keep time.Duration) *Coordinator {
	t.Helper()
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Logger, cfg.Clock, cfg.AuditMaxEntries, cfg.AuditRetention = dir, discardLogger(), clk, max, keep
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func listAudit(t *testing.T, c *Coordinator, req *coordpb.AuditRequest) []string {
	t.Helper()
	entries, _, err := c.audit.list(req)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, fmt.Sprintf("%s %s %s", e.Who, e.Job, codes.Code(e.Code)))
	}
	return out
}

// TestAuditLogBounds: the log keeps at most its count of entries and
// none older than its retention, the oldest going first; it survives a
// restart, which neither loads it into the index nor loses its count;
// filters select by job, caller and time.
func TestAuditLogBounds(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	clk := clock.NewFake(time.Unix(1_800_000_000, 0))
	c := auditCoordinator(t, dir, clk, 5, time.Hour)
	rec := func(who, job string, code codes.Code) {
		c.audit.record(transport.AuditEntry{At: clk.Now(), Who: who, Method: "/m", AuditArgs: transport.AuditArgs{Job: job}, Code: code})
		clk.Step(time.Minute)
	}
	for i := range 7 {
		rec("operator/alice", fmt.Sprintf("j%d", i), codes.OK)
	}
	if got := listAudit(t, c, &coordpb.AuditRequest{}); len(got) != 5 || !strings.Contains(got[0], " j2 ") {
		t.Fatalf("after 7 entries with room for 5: %q", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	c = auditCoordinator(t, dir, clk, 5, time.Hour)
	defer c.Close()
	if len(c.state.Jobs) != 0 {
		t.Fatalf("the audit log was loaded into the index: %d jobs", len(c.state.Jobs))
	}
	if c.audit.count != 5 {
		t.Fatalf("reopened log counts %d entries, want 5", c.audit.count)
	}
	rec("node/n1", "j7", codes.PermissionDenied)
	if got := listAudit(t, c, &coordpb.AuditRequest{Who: "node/"}); len(got) != 1 || got[0] != "node/n1 j7 PermissionDenied" {
		t.Fatalf("by caller: %q", got)
	}
	if got := listAudit(t, c, &coordpb.AuditRequest{Job: "j4"}); len(got) != 1 {
		t.Fatalf("by job: %q", got)
	}
	since := clk.Now().Add(-2*time.Minute - time.Second).UnixNano()
	if got := listAudit(t, c, &coordpb.AuditRequest{SinceUnixNano: since}); len(got) != 2 {
		t.Fatalf("since: %q", got)
	}
	if got := listAudit(t, c, &coordpb.AuditRequest{Limit: 2}); len(got) != 2 || !strings.Contains(got[1], " j7 ") {
		t.Fatalf("the newest 2: %q", got)
	}

	// An hour on, all but the entries of the last hour are gone, from
	// the store too.
	clk.Step(time.Hour - 2*time.Minute)
	if got := listAudit(t, c, &coordpb.AuditRequest{}); len(got) != 2 {
		t.Fatalf("an hour later: %q", got)
	}
	if c.audit.count != 2 {
		t.Fatalf("count %d after trimming, want 2", c.audit.count)
	}
	if _, _, err := c.audit.list(&coordpb.AuditRequest{Limit: maxAuditList + 1}); err == nil {
		t.Fatal("a limit over the maximum was accepted")
	}
}
