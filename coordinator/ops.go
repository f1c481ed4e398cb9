package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/tiers"
	"rewind.dev/rewind/transport"
)

// Register records an agent and merges its inventory: jobs it holds are
// registered from the shards' world sizes when the index does not know
// them (a coordinator rebuilding a lost store), and every shard is applied.
// It returns the pins for the jobs the agent holds.
func (c *Coordinator) Register(n *NodeInfo, inventory []Record, told map[string]int64) ([]*coordpb.Pin, error) {
	c.mu.Lock()
	c.noteLeadLocked() // first: the registration is stamped within the lead (noteLead)
	n.RegisteredAt = c.cfg.Clock.Now()
	err := c.store.PutNode(n)
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	// Apply the newest steps last, so a job's world size ends as its newest.
	slices.SortFunc(inventory, func(a, b Record) int { return int(a.Step - b.Step) })
	written, err := c.apply(func(ch *Changes) error {
		c.noteLeadLocked() // a lead that begins with this call expects the nodes known before it
		c.state.Nodes[n.Name] = n
		var errs []error
		for _, r := range inventory {
			j := c.state.Jobs[r.Job]
			if j == nil || j.WorldSize != r.WorldSize && r.Step > maxStep(j) {
				if _, err := c.state.RegisterJob(r.Job, r.WorldSize, map[uint32]string{r.Rank: r.Node}, ch); err != nil {
					errs = append(errs, err)
					continue
				}
			}
			if err := c.state.Apply(r, ch); err != nil {
				errs = append(errs, err)
			}
		}
		c.state.Reconcile(n.Name, inventory, ch)
		c.noteRegisteredLocked(n.Name, told)
		ch.Sync = true
		return errors.Join(errs...)
	})
	if written == nil {
		return nil, err // the store failed: the agent must register again
	}
	if err != nil {
		c.log.Warn("agent inventory had shards that could not be recorded", "node", n.Name, "err", err)
	}
	c.nodeUp(n.Name) // an agent that registers is alive, whatever was declared
	c.log.Info("agent registered", "node", n.Name, "addr", n.Addr, "failure_domain", n.FailureDomain, "shards", len(inventory))
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pinsLocked(n.Name, inventory), nil
}

func maxStep(j *Job) int64 {
	m := int64(-1)
	for s := range j.Steps {
		m = max(m, s)
	}
	return m
}

// step returns a step as the API shows it; the index is locked only to
// copy it (view.go).
func (c *Coordinator) step(ctx context.Context, job string, step int64) (*coordpb.Step, error) {
	v, err := c.view(ctx, job, step, -1, nil)
	if err != nil {
		return nil, err
	}
	return v.proto(ctx)
}

// sourceCost orders a rank's copies for a restore onto target, cheapest
// first: its own memory, a peer's memory in its failure domain, a peer's
// memory elsewhere, its own NVMe, another node's NVMe, the parallel
// filesystem, the object store.
func sourceCost(cp *Copy, target string, sameDomain func(a, b string) bool) int {
	switch {
	case cp.Tier == "shm" && cp.Node == target:
		return 0
	case cp.Tier == "shm" && sameDomain(cp.Node, target):
		return 1
	case cp.Tier == "shm":
		return 2
	case tiers.Name(cp.Tier) == tiers.NVMe && cp.Node == target:
		return 3
	case tiers.Name(cp.Tier) == tiers.NVMe:
		return 4
	case tiers.Name(cp.Tier) == tiers.PFS:
		return 5
	default:
		return 6
	}
}

// agentCall runs f against the agent of node over TCP.
func (c *Coordinator) agentCall(ctx context.Context, node string, f func(context.Context, agentpb.AgentClient) error) error {
	c.mu.Lock()
	n := c.state.Nodes[node]
	var alive context.Context
	if n != nil && n.Addr != "" {
		alive = c.nodeAliveLocked(node)
	}
	c.mu.Unlock()
	if alive == nil {
		return fmt.Errorf("coordinator: node %s has not registered an address", node)
	}
	if err := context.Cause(alive); err != nil {
		return fmt.Errorf("coordinator: node %s not called: %w", node, err)
	}
	conn, err := c.cfg.Transport.NewClient(n.Addr, transport.ExpectNode(node))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AgentTimeout)
	defer cancel()
	// A call the node's death ends: a frozen node answers nothing, and
	// a recovery waiting on it would hold its job until the timeout.
	ctx, gone := context.WithCancelCause(ctx)
	defer gone(nil)
	defer context.AfterFunc(alive, func() { gone(context.Cause(alive)) })()
	err = f(ctx, agentpb.NewAgentClient(conn))
	if cause := context.Cause(ctx); err != nil && cause != nil && errors.Is(cause, errNodeDeclaredDown) {
		return fmt.Errorf("coordinator: call to %s ended: %w", node, cause)
	}
	return err
}

// errNodeDeclaredDown ends the calls to a node in flight when it is
// declared down.
var errNodeDeclaredDown = errors.New("the node was declared down")

// nodeAliveLocked returns a context that ends when node is declared down
// (nodeDown), made for the calls to it from now on; for a node down
// already it has ended: a node declared down is called no more until it
// comes back (its agent registers, or it answers a direct ping), as a
// frozen node would hold each call until its timeout. What such a call
// would do is done otherwise: a restore's staged slots on it expire, its
// copies are passed over. The caller holds c.mu.
func (c *Coordinator) nodeAliveLocked(node string) context.Context {
	if _, down := c.down[node]; down {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errNodeDeclaredDown)
		return ctx
	}
	if a, ok := c.alive[node]; ok {
		return a.ctx
	}
	if c.alive == nil {
		c.alive = map[string]aliveNode{}
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	c.alive[node] = aliveNode{ctx: ctx, end: cancel}
	return ctx
}

// aliveNode ends the calls to a node when it is declared down.
type aliveNode struct {
	ctx context.Context
	end context.CancelCauseFunc
}

// endCallsLocked ends every call in flight to node, declared down for
// reason. The caller holds c.mu.
func (c *Coordinator) endCallsLocked(node, reason string) {
	if a, ok := c.alive[node]; ok {
		a.end(fmt.Errorf("%w: %s", errNodeDeclaredDown, reason))
		delete(c.alive, node)
	}
}

// VerifyStep asks every agent holding a copy of the step to verify it, the
// copies found corrupt before included. A tier copy that fails its
// checksums is marked corrupt (unrestorable.go), one marked so that
// verifies whole is a restore source again (an agent marks the copies in
// its memory itself), and a step found unrestorable whose every rank now
// has a copy that verifies is no longer marked so.
func (c *Coordinator) VerifyStep(ctx context.Context, job string, step int64) (*coordpb.VerifyStepResponse, error) {
	st, err := c.step(ctx, job, step)
	if err != nil {
		return nil, err
	}
	resp := &coordpb.VerifyStepResponse{Ok: uint32(len(uniqueRanks(st.Copies))) == st.WorldSize}
	type found struct {
		node string
		err  error
	}
	readers := map[string]found{} // by tier:node, so that a missing reader is waited for once
	good := map[uint32]bool{}     // ranks with a copy that verified
	for _, cp := range st.Copies {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("coordinator: verifying job %s step %d: %w", job, step, err)
		}
		check := &coordpb.CopyCheck{Copy: cp}
		node, tier := cp.Node, ""
		var err error
		if cp.Tier != "shm" { // a tier copy: read back by an agent that has the tier
			tier = cp.Tier
			k := cp.Tier + ":" + cp.Node
			f, ok := readers[k]
			if !ok {
				f.node, f.err = c.tiers.reader(ctx, cp.Tier, cp.Node)
				readers[k] = f
			}
			node, err = f.node, f.err
		}
		answered := false
		if err == nil {
			check.Ok, check.Problem, err = c.verifyShard(ctx, node, job, step, cp.Rank, tier)
			answered = err == nil
		}
		if err != nil {
			check.Problem = err.Error()
		}
		switch {
		case tier != "" && err != nil: // the tier may no longer hold it (tiermissing.go)
			c.noteMissing(ctx, job, step, cp.Rank, tier, cp.Node, node, err)
		case tier == "" || !answered:
		case !check.Ok: // the agent read the tier copy back and a checksum failed
			c.tiers.markCorrupt(job, step, cp.Rank, tier, check.Problem)
		case cp.State == coordpb.CopyState_COPY_STATE_CORRUPT:
			c.tiers.markWhole(job, step, cp.Rank, tier)
		}
		if check.Ok {
			good[cp.Rank] = true
		}
		resp.Ok = resp.Ok && check.Ok
		resp.Checks = append(resp.Checks, check)
	}
	if st.Unrestorable != nil && uint32(len(good)) == st.WorldSize {
		if _, err := c.apply(func(ch *Changes) error { return c.state.MarkUnrestorable(job, step, nil, ch) }); err != nil {
			return nil, err
		}
		c.log.Info("step found unrestorable verified whole: a restore may choose it again", "job", job, "step", step)
	}
	return resp, nil
}

func uniqueRanks(cs []*coordpb.Copy) map[uint32]bool {
	m := map[uint32]bool{}
	for _, c := range cs {
		m[c.Rank] = true
	}
	return m
}

// DeleteStep deletes every copy of a step. The latest consistent step is
// refused unless force is set: it is what a restore would use.
// Each node holding copies in memory is called once, for all of them
// (deleteFromMemory).
func (c *Coordinator) DeleteStep(ctx context.Context, job string, step int64, force bool) (int, error) {
	c.mu.Lock()
	if err := c.rebuildingLocked(job); err != nil && !force { // latest may be behind: what to refuse is not known yet
		c.mu.Unlock()
		return 0, err
	}
	j := c.state.Jobs[job]
	var latest int64 = -1
	if j != nil {
		latest = j.Latest
	}
	c.mu.Unlock()
	if j == nil {
		return 0, fmt.Errorf("%w: coordinator: no job %q", ErrUnknownJob, job)
	}
	if step == latest && !force {
		return 0, fmt.Errorf("%w: coordinator: step %d is the latest consistent step of job %s; deleting it would leave nothing newer to restore (use --force)", ErrRefused, step, job)
	}
	v, err := c.view(ctx, job, step, -1, nil)
	if err != nil {
		return 0, err
	}
	n := c.tiers.deleteStep(job, step) // tier copies: out of the index now, off the stores by the agents
	var gone []Record
	deleted, errs := c.deleteFromMemory(ctx, v)
	for _, cp := range deleted {
		gone = append(gone, Record{Job: job, Step: step, Rank: cp.Rank, WorldSize: v.WorldSize, Node: cp.Node, Tier: cp.Tier, State: CopyDeleted})
	}
	n += len(deleted)
	if len(gone) > 0 {
		if _, err := c.report("", gone); err != nil {
			errs = append(errs, err)
		}
	}
	c.log.Info("step deleted", "job", job, "step", step, "copies", n, "forced", force, "at", time.Now().UTC().Format(time.RFC3339))
	return n, errors.Join(errs...)
}

// deleteParallel is how many nodes a deletion calls at once: a step of
// thousands of ranks is in the memory of as many nodes.
const deleteParallel = 16

// deleteFromMemory deletes the step's copies in nodes' memory, one call
// per node (every rank's shard of the step it holds, replicas among
// them), deleteParallel nodes at a time, and returns the copies deleted:
// those on nodes that answered, and on nodes that are down (their memory
// is gone with them). A node that failed keeps its copies in the index.
func (c *Coordinator) deleteFromMemory(ctx context.Context, v *stepView) ([]*Copy, []error) {
	byNode := map[string][]*Copy{}
	for _, cp := range slices.Concat(v.copies, v.bad) {
		if cp.Tier == "shm" {
			byNode[cp.Node] = append(byNode[cp.Node], cp)
		}
	}
	var (
		mu      sync.Mutex
		deleted []*Copy
		errs    []error
		wg      sync.WaitGroup
	)
	sem := make(chan struct{}, deleteParallel)
	for _, node := range slices.Sorted(maps.Keys(byNode)) {
		cs := byNode[node]
		if c.isDown(node) {
			mu.Lock() // the calls started for earlier nodes append too
			deleted = append(deleted, cs...)
			mu.Unlock()
			continue
		}
		if err := ctx.Err(); err != nil { // what was deleted is still recorded
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := c.agentCall(ctx, node, func(ctx context.Context, a agentpb.AgentClient) error {
				_, err := a.Delete(ctx, &agentpb.DeleteRequest{Job: v.Job, AllRanks: true, Step: v.Step})
				return err
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%d copies on %s: %w", len(cs), node, err))
				return
			}
			deleted = append(deleted, cs...)
		})
	}
	wg.Wait()
	return deleted, errs
}
