package agent

import (
	"context"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/tiers"
)

// A durable tier copy that one of this node's own reads finds corrupt —
// a ranged open's header (against the coordinator's header checksum) or
// leaf hashes (against the header), a Fill's leaf (against its hash), a
// pull of the shard whole (against its checksums) — is read from the
// next source, and reported to the coordinator (SuspectTierCopy), which
// has another node verify the shard on the tier and, when that verify
// fails too, marks the copy corrupt: it leaves restore plans. A copy that
// cannot be read (missing, the store down) is no corruption and is not
// reported.
//
// Reports are best-effort and bounded: one per copy and shard while the
// agent runs (a shard every leaf of which is rotten is reported once),
// sent one at a time by one goroutine from a queue of maxSuspectQueue. A
// report the queue has no room for is forgotten, so the next read that
// finds the copy corrupt reports it again; one the coordinator could not
// take (the call failed, it was busy, it knew no such copy yet) may be
// reported again by a read suspectRetry after its answer, not before. A
// read never waits for a report. Only this node's own copies on a
// node-local tier are reported: another node's, read through that node,
// is that node's to report.

// maxSuspectQueue bounds the reports waiting to be sent.
const maxSuspectQueue = 64

// maxSuspectsSent bounds the copies remembered as reported; past it the
// memory starts over (a copy is then reported at most once more).
const maxSuspectsSent = 4096

// maxSuspectProblem bounds the text of a report's problem.
const maxSuspectProblem = 1024

// suspectTimeout bounds one report's call.
const suspectTimeout = 10 * time.Second

// suspectRetry is how long after a report the coordinator did not take
// the copy may be reported again: a copy read often costs the
// coordinator one report a minute, not one per read.
const suspectRetry = time.Minute

// suspectKey is one rank's shard of a tier copy.
type suspectKey struct {
	rankKey
	step int64
	tier string
}

// suspects are the tier copies this node's reads found corrupt: those
// reported, and the reports waiting to be sent. Guarded by the reporter's
// suspectMu.
type suspects struct {
	// sent holds the copies reported: the zero time for one queued or
	// taken, never reported again; for one the coordinator did not take,
	// when it may be reported again.
	sent  map[suspectKey]time.Time
	queue chan *coordpb.SuspectTierCopyRequest
}

func newSuspects() suspects {
	return suspects{sent: map[suspectKey]time.Time{}, queue: make(chan *coordpb.SuspectTierCopyRequest, maxSuspectQueue)}
}

// suspectTier reports src's copy of ps's shard to the coordinator when
// err, what reading it failed with, says it is corrupt and src is a
// durable tier this node read (package comment).
func (a *Agent) suspectTier(ps PeerShard, src Source, err error) {
	r := a.rep
	tier := tiers.Name(src.Tier)
	if r == nil || !isCorrupt(err) || !tier.Valid() || tier.NodeLocal() && src.Node != a.cfg.Node {
		return
	}
	k := suspectKey{rankKey{ps.Job, ps.Rank}, ps.Step, src.Tier}
	r.suspectMu.Lock()
	defer r.suspectMu.Unlock()
	if again, ok := r.suspects.sent[k]; ok && (again.IsZero() || a.cfg.Clock.Now().Before(again)) {
		return
	}
	if len(r.suspects.sent) >= maxSuspectsSent {
		clear(r.suspects.sent)
	}
	problem := err.Error()
	if len(problem) > maxSuspectProblem {
		problem = problem[:maxSuspectProblem] + "…"
	}
	req := &coordpb.SuspectTierCopyRequest{Node: a.cfg.Node, Job: ps.Job, Step: ps.Step, Rank: ps.Rank, Tier: src.Tier,
		HeaderChecksum: ps.HeaderSum, Problem: problem}
	select {
	case r.suspects.queue <- req:
		r.suspects.sent[k] = time.Time{}
	default:
		delete(r.suspects.sent, k)
		a.log.Warn("a corrupt tier copy not reported: too many reports waiting", "job", ps.Job, "rank", ps.Rank, "step", ps.Step, "tier", src.Tier)
	}
}

// sendSuspects sends the queued reports of corrupt tier copies until ctx
// ends.
func (r *reporter) sendSuspects(ctx context.Context) {
	for {
		var req *coordpb.SuspectTierCopyRequest
		select {
		case <-ctx.Done():
			return
		case req = <-r.suspects.queue:
		}
		cctx, cancel := context.WithTimeout(ctx, suspectTimeout)
		resp, err := r.c.SuspectTierCopy(cctx, req)
		cancel()
		r.suspectAnswered(req, resp.GetAnswer(), err)
	}
}

// suspectAnswered records how the coordinator answered req: a report it
// did not take (err, busy, no such copy) may be sent again after
// suspectRetry.
func (r *reporter) suspectAnswered(req *coordpb.SuspectTierCopyRequest, answer coordpb.SuspectAnswer, err error) {
	log := r.a.log.With("job", req.Job, "rank", req.Rank, "step", req.Step, "tier", req.Tier)
	switch {
	case err != nil:
		log.Warn("a corrupt tier copy could not be reported to the coordinator", "err", err)
	case answer == coordpb.SuspectAnswer_SUSPECT_ANSWER_BUSY || answer == coordpb.SuspectAnswer_SUSPECT_ANSWER_NO_SUCH_COPY:
		log.Info("a corrupt tier copy reported, not taken by the coordinator: reported again by a later read", "answer", answer.Label())
	default:
		log.Info("a corrupt tier copy reported to the coordinator", "answer", answer.Label())
		return
	}
	r.suspectMu.Lock()
	defer r.suspectMu.Unlock()
	r.suspects.sent[suspectKey{rankKey{req.Job, req.Rank}, req.Step, req.Tier}] = r.a.cfg.Clock.Now().Add(suspectRetry)
}
