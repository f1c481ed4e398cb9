package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/transport"
)

// auditRules are the coordinator's calls that change state and are
// recorded whenever they are served: agents' registrations, jobs'
// registrations by operators and the controller (policies, replicas,
// world sizes), deletions, restores, nodes declared down, tier copies
// nodes report corrupt. The commit path (Report, ReportStream, TierReport,
// Transfers: thousands of calls a step at scale, each a node reporting
// for itself) is not; its effect is the index. Every refused call is
// recorded, whatever its method (transport.Audit).
var auditRules = map[string]transport.AuditRule{
	coordpb.Coordinator_Register_FullMethodName: func(_ transport.Peer, req any) (transport.AuditArgs, bool) {
		r := req.(*coordpb.RegisterRequest)
		return transport.AuditArgs{Node: r.GetNode().GetName(),
			Detail: transport.Words("addr", r.GetNode().GetAddr(), "shards", len(r.Inventory))}, true
	},
	// A node registering its own ranks (a rank's first save on it, kept to
	// that by the rules) is the save path: one call per rank at a job's
	// start, which would crowd out everything else. An operator's or the
	// controller's registration, a policy or a replica count, is not.
	coordpb.Coordinator_RegisterJob_FullMethodName: func(caller transport.Peer, req any) (transport.AuditArgs, bool) {
		r := req.(*coordpb.RegisterJobRequest)
		replicas := ""
		if r.Replicas != nil {
			replicas = fmt.Sprint(*r.Replicas)
		}
		a := transport.ArgsOf(r)
		a.Detail = transport.Words("world_size", r.WorldSize, "ranks_placed", len(r.Placement), "policy", r.Policy, "replicas", replicas, "epoch", r.Epoch)
		return a, caller.Identity.Role != transport.RoleNode
	},
	coordpb.Coordinator_DeleteStep_FullMethodName: transport.Audited(func(req any) string {
		return transport.Words("force", req.(*coordpb.DeleteStepRequest).Force)
	}),
	// A node's report may take a tier copy out of restore plans (once
	// verified): one call per copy and shard a node's reads found corrupt.
	coordpb.Coordinator_SuspectTierCopy_FullMethodName: transport.Audited(func(req any) string {
		r := req.(*coordpb.SuspectTierCopyRequest)
		return transport.Words("rank", r.Rank, "tier", r.Tier)
	}),
	coordpb.Coordinator_NodeDown_FullMethodName: transport.Audited(func(req any) string {
		return transport.Words("reason", req.(*coordpb.NodeDownRequest).Reason)
	}),
	// A certificate issued, or refused: the node named; never the token.
	coordpb.Coordinator_Enroll_FullMethodName: func(_ transport.Peer, req any) (transport.AuditArgs, bool) {
		r := req.(*coordpb.EnrollRequest)
		return transport.AuditArgs{Node: r.Node, Detail: transport.Words("csr_bytes", len(r.Csr))}, true
	},
	// A dry run changes nothing; a restore does.
	coordpb.Coordinator_PlanRestore_FullMethodName: func(_ transport.Peer, req any) (transport.AuditArgs, bool) {
		r := req.(*coordpb.PlanRestoreRequest)
		a := transport.ArgsOf(r)
		a.Detail = transport.Words("dry_run", r.DryRun, "restart", r.Restart, "force", r.Force, "requested_by", r.RequestedBy)
		return a, !r.DryRun
	},
}

// auditLog keeps the audit log in the store, under audit/<time>/<seq>,
// bounded by a count and an age (Config.AuditMaxEntries,
// Config.AuditRetention): the oldest entries go first. Each entry is
// written synced before the call's answer leaves; concurrent calls' writes
// are synced together (pebble groups them). Safe for concurrent use; it
// does not take the coordinator's lock.
type auditLog struct {
	clock  clock.Clock
	log    *slog.Logger
	max    int
	keep   time.Duration
	failed prometheus.Counter

	life sync.RWMutex // held to read while using db; close takes it to write
	db   *pebble.DB   // nil once closed

	mu     sync.Mutex // guards what follows, and trimming
	count  int        // entries in the store
	oldest time.Time  // of the oldest entry; zero when none
	seq    uint64     // orders entries of one instant
}

// auditPrefix starts every audit key; auditEnd is past them all.
const auditPrefix, auditEnd = "audit/", "audit0"

// auditRecord is an entry's value in the store.
type auditRecord struct {
	Who     string `json:"who"`
	Method  string `json:"method"`
	Job     string `json:"job,omitempty"`
	Step    *int64 `json:"step,omitempty"`
	Node    string `json:"node,omitempty"`
	Detail  string `json:"detail,omitempty"`
	Code    uint32 `json:"code,omitempty"`
	Error   string `json:"error,omitempty"`
	AtNanos int64  `json:"at"`
}

func auditKey(at time.Time, seq uint64) []byte {
	return fmt.Appendf(nil, "%s%020d/%020d", auditPrefix, at.UnixNano(), seq)
}

// openAudit counts the entries the store holds.
func openAudit(cfg Config, db *pebble.DB, reg prometheus.Registerer) (*auditLog, error) {
	a := &auditLog{clock: cfg.Clock, log: cfg.Logger.With("component", "audit"), max: cfg.AuditMaxEntries, keep: cfg.AuditRetention, db: db,
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "rewind_coordinator_audit_write_errors_total",
			Help: "Audit log entries the coordinator could not write to its store (each also logged at error level)."})}
	if err := reg.Register(a.failed); err != nil {
		return nil, fmt.Errorf("coordinator: metrics: %w", err)
	}
	err := a.scan(func(k []byte, r *auditRecord) bool {
		if a.count == 0 {
			a.oldest = time.Unix(0, r.AtNanos)
		}
		a.count++
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("coordinator: reading the audit log: %w", err)
	}
	return a, nil
}

// scan calls f with each entry, oldest first, until f returns false.
func (a *auditLog) scan(f func(key []byte, r *auditRecord) bool) error {
	it, err := a.db.NewIter(&pebble.IterOptions{LowerBound: []byte(auditPrefix), UpperBound: []byte(auditEnd)})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		var r auditRecord
		if err := json.Unmarshal(it.Value(), &r); err != nil {
			return fmt.Errorf("entry %q: %w", it.Key(), err)
		}
		if !f(bytes.Clone(it.Key()), &r) {
			break
		}
	}
	return it.Error()
}

// record writes e, then trims the log to its bounds. A failure to write
// is logged and counted: it does not fail the call.
func (a *auditLog) record(e transport.AuditEntry) {
	r := auditRecord{Who: e.Who, Method: e.Method, Job: e.Job, Node: e.Node, Detail: e.Detail, Code: uint32(e.Code), Error: e.Error, AtNanos: e.At.UnixNano()}
	if e.HasStep {
		r.Step = &e.Step
	}
	data, err := json.Marshal(r)
	a.life.RLock()
	defer a.life.RUnlock()
	if err == nil && a.db != nil {
		a.mu.Lock()
		a.seq++
		key := auditKey(e.At, a.seq)
		a.mu.Unlock()
		if err = a.db.Set(key, data, pebble.Sync); err == nil {
			a.mu.Lock()
			if a.count == 0 || e.At.Before(a.oldest) {
				a.oldest = e.At
			}
			a.count++
			err = a.trimLocked()
			a.mu.Unlock()
		}
	}
	if err != nil {
		a.failed.Inc()
		a.log.Error("audit log entry not written", "who", e.Who, "method", e.Method, "code", e.Code.String(), "err", err)
	}
}

// trimLocked deletes the oldest entries while there are more than max,
// or they are older than keep; the caller holds a.mu, and a.life to read.
func (a *auditLog) trimLocked() error {
	cutoff := a.clock.Now().Add(-a.keep)
	if a.count <= a.max && !a.oldest.Before(cutoff) {
		return nil
	}
	b := a.db.NewBatch()
	defer b.Close()
	count, oldest := a.count, time.Time{}
	err := a.scan(func(k []byte, r *auditRecord) bool {
		if count <= a.max && !time.Unix(0, r.AtNanos).Before(cutoff) {
			oldest = time.Unix(0, r.AtNanos)
			return false
		}
		count--
		return b.Delete(k, nil) == nil
	})
	if err != nil {
		return err
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return err
	}
	a.count, a.oldest = count, oldest
	return nil
}

// list returns the newest entries that match req, oldest first, and how
// many matched. Entries past the retention age are trimmed first.
func (a *auditLog) list(req *coordpb.AuditRequest) ([]*coordpb.AuditEntry, uint32, error) {
	limit := int(req.Limit)
	if limit == 0 {
		limit = 100
	}
	if limit > maxAuditList {
		return nil, 0, fmt.Errorf("%w: coordinator: audit: limit %d is over %d", ErrInvalid, limit, maxAuditList)
	}
	a.life.RLock()
	defer a.life.RUnlock()
	if a.db == nil {
		return nil, 0, fmt.Errorf("coordinator: audit: the store is closed")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.trimLocked(); err != nil {
		return nil, 0, fmt.Errorf("coordinator: audit: trimming: %w", err)
	}
	var out []*coordpb.AuditEntry
	matched := uint32(0)
	err := a.scan(func(_ []byte, r *auditRecord) bool {
		if r.AtNanos < req.SinceUnixNano || req.Job != "" && r.Job != req.Job || req.Who != "" && !strings.Contains(r.Who, req.Who) {
			return true
		}
		matched++
		out = append(out, &coordpb.AuditEntry{AtUnixNano: r.AtNanos, Who: r.Who, Method: r.Method, Job: r.Job, Step: r.Step,
			Node: r.Node, Detail: r.Detail, Code: r.Code, Error: r.Error})
		if len(out) > limit {
			out = out[1:]
		}
		return true
	})
	if err != nil {
		return nil, 0, fmt.Errorf("coordinator: audit: %w", err)
	}
	return out, matched, nil
}

// maxAuditList bounds the entries one Audit call returns (DESIGN
// invariant 10): a few MiB.
const maxAuditList = 10000

func (a *auditLog) close() {
	a.life.Lock()
	defer a.life.Unlock()
	a.db = nil
}

// Audit answers the audit log.
func (s *server) Audit(_ context.Context, req *coordpb.AuditRequest) (*coordpb.AuditResponse, error) {
	entries, matched, err := s.c.audit.list(req)
	if err != nil {
		return nil, toStatus(err)
	}
	return &coordpb.AuditResponse{Entries: entries, Matched: matched}, nil
}
