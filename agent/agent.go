package agent

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/transport"
	"rewind.dev/rewind/vfs"
)

// Agent is the state of one node agent. Its methods are safe for concurrent
// use: operations on one rank are serialized by a per-rank mutex, the budget
// by the agent's mutex.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	paths   shm.Paths
	segs    *shm.Segments
	metrics *metrics
	fsStat  vfs.FSStat
	budget  uint64

	mu    sync.Mutex // guards ranks, used, jobUsed, seq, leases
	ranks map[rankKey]*lockedRank
	used  uint64
	// jobUsed: the bytes of each job's segments, own and replicas
	// (Config.JobBudgetBytes); the warm segment, no job's, is in used alone.
	jobUsed map[string]uint64
	seq     uint64
	leases  map[uint64]*lease
	// partials are the partially open shards of other nodes (partial.go),
	// by lease.
	partials map[uint64]*partial

	verifyQ chan verifyJob

	rep       *reporter             // nil without a coordinator
	tr        *transfers            // nil without a coordinator
	peers     peers                 // connections to other agents
	authz     *transport.Authorizer // who may call what over TCP
	auditor   *transport.Audit      // records state-changing and refused calls (transport.go)
	gang      gang                  // jobs being recovered
	epochs    epochs                // each job's epoch, as the coordinator told it (epoch.go)
	warm      warm                  // a segment made ready ahead of need
	advertise string
}

type rankKey struct {
	job  string
	rank uint32
}

type lockedRank struct {
	mu sync.Mutex
	// copyMu serializes copies into the rank's slots from elsewhere (a
	// replica, a restore from a peer or a tier): unlike a rank's own
	// saves, which its one session makes one at a time, two could
	// otherwise pick the same slot.
	copyMu sync.Mutex
	rankState
}

type lease struct {
	r       *lockedRank
	s       *slot
	expires time.Time
}

// New runs the pre-flight check, re-indexes the segments under the root and
// returns an agent ready to serve. It refuses a misconfigured node.
func New(cfg Config) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.FS = cfg.Faults.FS(cfg.FS, "shm")
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	a := &Agent{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "agent", "node", cfg.Node),
		paths:    shm.Paths{Root: cfg.ShmRoot},
		ranks:    map[rankKey]*lockedRank{},
		jobUsed:  map[string]uint64{},
		leases:   map[uint64]*lease{},
		partials: map[uint64]*partial{},
		verifyQ:  make(chan verifyJob, 1024),
	}
	// Segments are the agent's alone: ranks get file descriptors
	// (segserver.go), never paths they could open.
	a.segs = &shm.Segments{FS: cfg.FS, Paths: a.paths, FileMode: 0o600}
	if err := a.preflight(); err != nil {
		return nil, err
	}
	a.metrics = newMetrics(cfg.Registry, a)
	if err := a.initTransport(); err != nil {
		return nil, err
	}
	err := a.reindex()
	if err != nil {
		return nil, err
	}
	if err := a.clearPartials(); err != nil {
		return nil, fmt.Errorf("agent: removing partially open shards of a previous run: %w", err)
	}
	if cfg.CoordinatorAddr != "" {
		if a.rep, err = newReporter(a, cfg.CoordinatorAddr); err != nil {
			return nil, err
		}
		a.tr = newTransfers(a)
	}
	a.advertise = cfg.AdvertiseAddr
	if a.advertise == "" && cfg.ListenAddr != "" {
		if host, port, err := net.SplitHostPort(cfg.ListenAddr); err == nil && port != "0" && transport.IsLoopback(cfg.ListenAddr) && host != "" {
			a.advertise = cfg.ListenAddr // a node on loopback: no other machine reaches it by its name
		} else if err == nil {
			a.advertise = net.JoinHostPort(cfg.Node, port)
		}
	}
	return a, nil
}

func newToken() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return binary.LittleEndian.Uint64(b[:]) | 1 // never zero
}

func (a *Agent) rank(job string, rank uint32, create bool) *lockedRank {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := rankKey{job, rank}
	r := a.ranks[k]
	if r == nil && create {
		r = &lockedRank{rankState: rankState{job: job, rank: rank}}
		a.ranks[k] = r
	}
	return r
}

// reserveBudget accounts for a segment of job growing from old to size
// bytes: within the node's budget, and within the job's share of it
// (Config.JobBudgetBytes) for a job's segment (not the warm one).
func (a *Agent) reserveBudget(job string, rank uint32, old, size int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if size <= old {
		return nil
	}
	grow := uint64(size - old)
	if a.used+grow > a.budget {
		left := uint64(0)
		if a.budget > a.used {
			left = a.budget - a.used
		}
		return fmt.Errorf("%w: agent: segment for job %s rank %d is %s, budget left %s (budget %s, %s in use)",
			ErrBudget, job, rank, units.Bytes(uint64(size)), units.Bytes(left), units.Bytes(a.budget), units.Bytes(a.used))
	}
	if job != warmName {
		if jb := a.cfg.JobBudgetBytes; jb > 0 && a.jobUsed[job]+grow > jb {
			return &jobBudgetError{fmt.Sprintf("%v: agent: segment for job %s rank %d is %s, the job's share of this node's budget left %s (--job-budget %s, %s in use by the job's segments here)",
				ErrBudget, job, rank, units.Bytes(uint64(size)), units.Bytes(jb-min(jb, a.jobUsed[job])), units.Bytes(jb), units.Bytes(a.jobUsed[job]))}
		}
		a.jobUsed[job] += grow
	}
	a.used += grow
	return nil
}

// budgetLeft returns the bytes of the budget that job's segments may still
// take: what the node's budget has not in use, and no more than what is
// left of the job's share.
func (a *Agent) budgetLeft(job string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used >= a.budget {
		return 0
	}
	left := a.budget - a.used
	if jb := a.cfg.JobBudgetBytes; jb > 0 {
		left = min(left, jb-min(jb, a.jobUsed[job]))
	}
	return int64(min(left, maxShardBytes))
}

// adjustUsed records a size change of a segment of job, once the file has
// changed.
func (a *Agent) adjustUsed(job string, delta int64) {
	a.mu.Lock()
	a.used = uint64(int64(a.used) + delta)
	if job != warmName {
		if n := int64(a.jobUsed[job]) + delta; n > 0 {
			a.jobUsed[job] = uint64(n)
		} else {
			delete(a.jobUsed, job)
		}
	}
	a.mu.Unlock()
}

func (a *Agent) nextSeq() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	return a.seq
}

// jobBytes returns the bytes of each job's segments.
func (a *Agent) jobBytes() map[string]uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.jobUsed)
}

// Used returns the bytes of all segments and the budget.
func (a *Agent) Used() (used, budget uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.used, a.budget
}

func validateRank(job string, rank, worldSize uint32) error {
	if err := shm.ValidateJob(job); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if worldSize != 0 && rank >= worldSize {
		return fmt.Errorf("%w: agent: rank %d out of range for world size %d", ErrInvalid, rank, worldSize)
	}
	return nil
}
