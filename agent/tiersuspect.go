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
// verifies the shard on the tier and, when that verify fails too, marks
// the copy corrupt: it leaves restore plans. A copy that cannot be read
// (missing, the store down) is no corruption and is not reported.
//
// Reports are best-effort and bounded: one per copy and shard while the
// agent runs (a shard every leaf of which is rotten is reported once),
// sent one at a time by one goroutine from a queue of maxSuspectQueue. A
// report the queue has no room for, or that the coordinator does not
// take, is forgotten, so the next read that finds the copy corrupt
// reports it again. A read never waits for a report. Only this node's
// own copies on a node-local tier are reported: another node's, read
// through that node, is that node's to report.

// maxSuspectQueue bounds the reports waiting to be sent.
const maxSuspectQueue = 64

// maxSuspectsSent bounds the copies remembered as reported; past it the
// memory starts over (a copy is then reported at most once more).
const maxSuspectsSent = 4096

// maxSuspectProblem bounds the text of a report's problem.
const maxSuspectProblem = 1024

// suspectTimeout bounds one report's call.
const suspectTimeout = 10 * time.Second

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
	sent  map[suspectKey]bool
	queue chan *coordpb.SuspectTierCopyRequest
}

func newSuspects() suspects {
	return suspects{sent: map[suspectKey]bool{}, queue: make(chan *coordpb.SuspectTierCopyRequest, maxSuspectQueue)}
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
	if r.suspects.sent[k] {
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
		r.suspects.sent[k] = true
	default:
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
		if err != nil {
			r.a.log.Warn("a corrupt tier copy could not be reported to the coordinator", "job", req.Job, "rank", req.Rank, "step", req.Step,
				"tier", req.Tier, "err", err)
			r.suspectMu.Lock()
			delete(r.suspects.sent, suspectKey{rankKey{req.Job, req.Rank}, req.Step, req.Tier})
			r.suspectMu.Unlock()
			continue
		}
		r.a.log.Info("a corrupt tier copy reported to the coordinator", "job", req.Job, "rank", req.Rank, "step", req.Step,
			"tier", req.Tier, "checking", resp.Checking)
	}
}
