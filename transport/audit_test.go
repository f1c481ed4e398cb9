package transport

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
)

// auditLog collects what an Audit records.
type auditLog struct {
	mu      sync.Mutex
	entries []AuditEntry
}

func (l *auditLog) record(e AuditEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, e)
}

func (l *auditLog) take() []AuditEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.entries
	l.entries = nil
	return out
}

// serveAudited is serve with an Audit first in the chains, recording
// DeleteStep always, and everything refused.
func serveAudited(t *testing.T, s *Security, log *auditLog) string {
	t.Helper()
	au := NewAudit(map[string]AuditRule{coordpb.Coordinator_DeleteStep_FullMethodName: Audited(func(req any) string {
		return Words("force", req.(*coordpb.DeleteStepRequest).Force, "empty", "")
	})}, clock.NewFake(time.Unix(1_800_000_000, 0)), log.record)
	return serveWith(t, s, au)
}

// TestAuditRecords: a recorded method is recorded whatever its outcome,
// with its caller and arguments; an unrecorded one only when refused,
// Unauthenticated or PermissionDenied, a stream with the message its
// check refused.
func TestAuditRecords(t *testing.T) {
	p := newPKI(t)
	log := &auditLog{}
	addr := serveAudited(t, p.sec(Identity{RoleCoordinator, "coord"}), log)
	bare := p.sec(Identity{RoleReader, "r"})
	bare.files.cur.cert.Certificate = nil
	for name, tc := range map[string]struct {
		s    *Security
		call func(context.Context, coordpb.CoordinatorClient) error
		want string // who method job step node detail code; "": nothing recorded
	}{
		"an operator's delete":          {p.sec(Identity{RoleOperator, "alice"}), deleteStep, "operator/alice DeleteStep j 1  force=false Unimplemented"},
		"a node's delete":               {p.sec(Identity{RoleNode, "n1"}), deleteStep, "node/n1 DeleteStep j 1  force=false PermissionDenied"},
		"a reader's listing":            {p.sec(Identity{RoleReader, "bob"}), listJobs, ""},
		"a listing with no certificate": {bare, listJobs, "unauthenticated ListJobs  -   Unauthenticated"},
		"a node's report for another":   {p.sec(Identity{RoleNode, "n1"}), report("n2"), "node/n1 Report  - n2  PermissionDenied"},
		"a node's stream for another":   {p.sec(Identity{RoleNode, "n1"}), reportStream("n2"), "node/n1 ReportStream  - n2  PermissionDenied"},
		"a node's stream for itself":    {p.sec(Identity{RoleNode, "n1"}), reportStream("n1"), ""},
	} {
		t.Run(name, func(t *testing.T) {
			call(t, tc.s, addr, tc.call)
			got := log.take()
			if tc.want == "" {
				if len(got) != 0 {
					t.Fatalf("recorded %+v, want nothing", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("recorded %d entries, want 1: %+v", len(got), got)
			}
			e := got[0]
			step := "-"
			if e.HasStep {
				step = "1"
			}
			who, _, _ := strings.Cut(e.Who, " ")
			line := strings.Join([]string{who, e.Method[strings.LastIndex(e.Method, "/")+1:], e.Job, step, e.Node, e.Detail, e.Code.String()}, " ")
			if line != tc.want {
				t.Errorf("recorded %q, want %q", line, tc.want)
			}
			if e.Code != codes.OK && e.Code != codes.Unimplemented && !strings.Contains(e.Error, "transport:") {
				t.Errorf("a refusal recorded without its reason: %q", e.Error)
			}
			if e.At != time.Unix(1_800_000_000, 0) {
				t.Errorf("recorded at %v, not the audit's clock", e.At)
			}
		})
	}
}
