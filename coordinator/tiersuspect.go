package coordinator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// A durable tier copy that an agent's own read found corrupt (a ranged
// read's header, leaf hashes or leaf; an on-demand pull) is reported with
// SuspectTierCopy. The coordinator does not take the node's word for it:
// a broken or hostile node (docs/design/20261127_threat_model.md) must not
// be able to take good copies out of every restore plan by saying so. It
// checks the shard itself, as rewind verify does: a connected agent with
// the tier other than the reporter (never the reporter: its Verify would
// be its word again) reads the shard back and verifies it (agent
// VerifyTier), and only a verify that finds the shard corrupt marks the
// copy (tiercorrupt.go), and only while this replica leads. With no other
// agent with the tier connected within readerWait, the check gives up and
// marks nothing; nor does a verify that cannot read the copy (the object
// gone, the store down), nor a report that names no durable copy of the
// header checksum the index holds.
//
// A copy on a node-local tier is readable by its own node alone, so a
// report of it (only its own node's is taken) cannot be checked by
// another: it is not marked on the reporter's word (SUSPECT_ANSWER_NODE_LOCAL),
// since one corrupt shard takes the whole step's copy on that tier, every
// node's, out at retention's next pass (tierevents.go retain). A node
// that lies about its own NVMe loses only what it holds anyway; a read of
// a truly corrupt one fails its checksums and falls back to the next
// source, and a restore's fetch or rewind verify marks it.
//
// The checks are bounded: one per shard at a time, at most
// maxSuspectsPending waiting or running (maxSuspectsPerNode of them from
// one reporter, so that one node cannot crowd out the others' reports) and
// suspectWorkers running, in the background (Close waits for them); a
// shard verified whole is not checked again for suspectRecheck, whoever
// reports it.

const (
	// maxSuspectsPending bounds the checks waiting or running: each may
	// read a whole shard back.
	maxSuspectsPending = 64
	// maxSuspectsPerNode bounds the checks waiting or running that one
	// node reported: a node's reads report a corrupt copy once, so a
	// node with more pending is broken, hostile, or finds a whole step
	// rotten (checked a few at a time all the same).
	maxSuspectsPerNode = 4
	// suspectWorkers is how many checks read shards back at once: they
	// share the tiers with the transfers.
	suspectWorkers = 2
	// suspectRecheck is how long a shard verified whole after a report
	// is not checked again: a node that keeps reporting a good copy costs
	// one read of it per period, not one per report.
	suspectRecheck = 10 * time.Minute
	// maxSuspectsWhole bounds the shards remembered as verified whole.
	maxSuspectsWhole = 4096
)

// suspectKey is one rank's shard of a tier copy.
type suspectKey struct {
	job  string
	step int64
	rank uint32
	tier string
}

// suspects are the shards reported corrupt being checked, and those
// verified whole lately. Safe for concurrent use.
type suspects struct {
	sem chan struct{} // a check running holds one

	mu      sync.Mutex
	pending map[suspectKey]string    // waiting or running: the reporter
	byNode  map[string]int           // pending checks by reporter
	whole   map[suspectKey]time.Time // verified whole, when
}

func newSuspects() *suspects {
	return &suspects{sem: make(chan struct{}, suspectWorkers), pending: map[suspectKey]string{}, byNode: map[string]int{},
		whole: map[suspectKey]time.Time{}}
}

// begin returns the answer to reporter's report of k, and whether a check
// of k is to start now; if so it records it as pending.
func (s *suspects) begin(k suspectKey, reporter string, now time.Time) (coordpb.SuspectAnswer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pending[k]; ok {
		return coordpb.SuspectAnswer_SUSPECT_ANSWER_CHECKING, false
	}
	if at, ok := s.whole[k]; ok && now.Sub(at) < suspectRecheck {
		return coordpb.SuspectAnswer_SUSPECT_ANSWER_VERIFIED_RECENTLY, false
	}
	if len(s.pending) >= maxSuspectsPending || s.byNode[reporter] >= maxSuspectsPerNode {
		return coordpb.SuspectAnswer_SUSPECT_ANSWER_BUSY, false
	}
	s.pending[k] = reporter
	s.byNode[reporter]++
	return coordpb.SuspectAnswer_SUSPECT_ANSWER_CHECKING, true
}

// end records that the check of k is over; whole says it verified whole.
func (s *suspects) end(k suspectKey, whole bool, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reporter, ok := s.pending[k]; ok {
		delete(s.pending, k)
		if s.byNode[reporter]--; s.byNode[reporter] <= 0 {
			delete(s.byNode, reporter)
		}
	}
	if !whole {
		return
	}
	if len(s.whole) >= maxSuspectsWhole {
		for o, at := range s.whole {
			if now.Sub(at) >= suspectRecheck || len(s.whole) >= maxSuspectsWhole {
				delete(s.whole, o)
			}
		}
	}
	s.whole[k] = now
}

// SuspectTierCopy starts, in the background, a check of the tier copy
// shard that node reports corrupt, as the package comment says. It
// returns what it does with the report.
func (c *Coordinator) SuspectTierCopy(req *coordpb.SuspectTierCopyRequest) (coordpb.SuspectAnswer, error) {
	if err := shm.ValidateNode(req.Node); err != nil {
		return 0, fmt.Errorf("%w: coordinator: tier copy reported corrupt: %w", ErrInvalid, err)
	}
	if err := shm.ValidateJob(req.Job); err != nil {
		return 0, fmt.Errorf("%w: coordinator: tier copy reported corrupt: %w", ErrInvalid, err)
	}
	if !tiers.Name(req.Tier).Valid() {
		return 0, fmt.Errorf("%w: coordinator: tier copy reported corrupt on %q, not a durable tier (%v)", ErrInvalid, req.Tier, tiers.Names())
	}
	k := suspectKey{req.Job, req.Step, req.Rank, req.Tier}
	copyNode, answer := c.tiers.suspectable(k, req.Node, req.HeaderChecksum)
	if copyNode == "" {
		return answer, nil
	}
	if copyNode != sharedNode { // the reporter's own node-local copy
		c.log.Warn("a node reports its own node-local tier copy's shard corrupt: no other node can read it to check, not marked",
			"job", req.Job, "step", req.Step, "rank", req.Rank, "tier", req.Tier, "node", req.Node, "problem", oneLine(req.Problem))
		return coordpb.SuspectAnswer_SUSPECT_ANSWER_NODE_LOCAL, nil
	}
	answer, start := c.suspects.begin(k, req.Node, c.cfg.Clock.Now())
	if !start {
		return answer, nil
	}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		c.suspects.end(k, false, c.cfg.Clock.Now())
		return coordpb.SuspectAnswer_SUSPECT_ANSWER_BUSY, nil
	}
	c.bg.Add(1)
	c.mu.Unlock()
	c.log.Warn("a node reports a tier copy's shard corrupt: verifying it", "job", req.Job, "step", req.Step, "rank", req.Rank,
		"tier", req.Tier, "node", req.Node, "problem", oneLine(req.Problem))
	go func() {
		defer c.bg.Done()
		c.suspects.end(k, c.checkSuspect(c.bgCtx, k, req.Node), c.cfg.Clock.Now())
	}()
	return answer, nil
}

// checkSuspect has an agent other than reporter verify the shard k of a
// shared tier's copy that reporter found corrupt, and settles the report
// (settleSuspect). It reports whether the shard verified whole.
func (c *Coordinator) checkSuspect(ctx context.Context, k suspectKey, reporter string) bool {
	select {
	case c.suspects.sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	defer func() { <-c.suspects.sem }()
	node, err := c.tiers.readerBut(ctx, k.tier, sharedNode, reporter)
	if err != nil {
		c.log.Warn("a tier copy reported corrupt could not be checked: not marked", "job", k.job, "step", k.step, "rank", k.rank, "tier", k.tier,
			"reporter", reporter, "err", err)
		return false
	}
	ok, problem, err := c.verifyShard(ctx, node, k.job, k.step, k.rank, k.tier)
	return c.settleSuspect(k, reporter, node, ok, problem, err)
}

// settleSuspect acts on verifier's verify of the shard k that reporter
// found corrupt: ok, or problem, or err when it did not answer. It marks
// the copy corrupt when the verify failed and this replica leads, and
// reports whether the shard verified whole.
func (c *Coordinator) settleSuspect(k suspectKey, reporter, verifier string, ok bool, problem string, err error) bool {
	switch {
	case err != nil:
		c.log.Warn("a tier copy reported corrupt could not be checked: not marked", "job", k.job, "step", k.step, "rank", k.rank, "tier", k.tier,
			"reporter", reporter, "verifier", verifier, "err", err)
	case ok:
		c.log.Info("a tier copy reported corrupt verified whole: still a restore source", "job", k.job, "step", k.step, "rank", k.rank, "tier", k.tier,
			"reporter", reporter, "verifier", verifier)
	case !c.leading():
		c.log.Warn("a tier copy reported corrupt failed its verify, but this replica no longer leads: not marked", "job", k.job, "step", k.step,
			"rank", k.rank, "tier", k.tier, "reporter", reporter, "verifier", verifier)
	default:
		c.tiers.markCorrupt(k.job, k.step, k.rank, k.tier, fmt.Sprintf("%s (reported by node %s, verified by node %s)", problem, reporter, verifier))
	}
	return err == nil && ok
}

// verifyShard has node's agent verify rank's shard of job's step: its
// copy in the node's memory (tier ""), or the copy on tier, read back. ok
// false with a problem: a checksum failed; an error: the verify did not
// answer (the copy unreadable, the agent unreachable).
func (c *Coordinator) verifyShard(ctx context.Context, node, job string, step int64, rank uint32, tier string) (ok bool, problem string, _ error) {
	err := c.agentCall(ctx, node, func(ctx context.Context, a agentpb.AgentClient) error {
		v, err := a.Verify(ctx, &agentpb.VerifyRequest{Job: job, Rank: rank, Step: step, Tier: tier})
		if err == nil {
			ok, problem = v.Ok, v.Problem
		}
		return err
	})
	return ok, problem, err
}

// suspectable returns the node of the durable copy of k on its tier
// (sharedNode on a shared tier) when k is a shard of it that is not
// marked corrupt, has header checksum sum (when given), and, on a
// node-local tier, is on node; otherwise "" and the answer to the report:
// no such copy, or one already marked corrupt.
func (t *tiering) suspectable(k suspectKey, node, sum string) (string, coordpb.SuspectAnswer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	none := coordpb.SuspectAnswer_SUSPECT_ANSWER_NO_SUCH_COPY
	tc := t.copies[tierKey{k.job, k.step, k.tier}]
	if t.closed || tc == nil || tc.State != tcDurable {
		return "", none
	}
	at := tc.copyNode(k.rank)
	if at == "" || at != sharedNode && at != node {
		return "", none
	}
	for _, s := range tc.Shards {
		if s.Rank == k.rank && (sum == "" || s.HeaderChecksum == sum) {
			if tc.Corrupt[k.rank] != "" {
				return "", coordpb.SuspectAnswer_SUSPECT_ANSWER_ALREADY_CORRUPT
			}
			return at, coordpb.SuspectAnswer_SUSPECT_ANSWER_CHECKING
		}
	}
	return "", none
}

// oneLine is s on one line, at most maxFailureText bytes.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxFailureText {
		s = s[:maxFailureText] + "…"
	}
	return s
}
