package agent

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// Push copies a committed shard to a tier straight from its segment: the
// store reads the mapping (no copy into the Go heap), and its leaf hashes
// beside it (tiers.LeavesName). The shard is verified before it leaves and
// pinned while it is read, so a save cannot reuse its slot meanwhile. It
// returns the shard's manifest entry.
func (a *Agent) Push(ctx context.Context, st tiers.Store, job string, rank uint32, step int64) (tiers.ShardEntry, error) {
	return a.push(ctx, st, job, rank, step, nil, nil)
}

// push is Push with the segment's reader wrapped (a bandwidth limit,
// progress), and done called with the shard's size once it is over.
func (a *Agent) push(ctx context.Context, st tiers.Store, job string, rank uint32, step int64,
	wrap func(size int64, src io.ReaderAt) io.ReaderAt, done func(size int64)) (tiers.ShardEntry, error) {
	sh, release, err := a.pin(job, rank, step)
	if err != nil {
		return tiers.ShardEntry{}, err
	}
	defer release()
	f, err := a.cfg.FS.OpenFile(sh.Path, os.O_RDONLY, 0)
	if err != nil {
		return tiers.ShardEntry{}, fmt.Errorf("agent: push of job %s rank %d step %d: %w", job, rank, step, err)
	}
	defer f.Close()
	m, err := shm.Map(f, sh.Size, false)
	if err != nil {
		return tiers.ShardEntry{}, err
	}
	defer m.Close()
	// The segment is mapped: a store that can write straight from it
	// (tiers.SliceReaderAt) does, with no copy.
	var src io.ReaderAt = tiers.BytesReaderAt(m.Data)
	if wrap != nil {
		src = wrap(sh.Size, src)
		defer done(sh.Size)
	}
	if err := st.Put(ctx, tiers.ShardName(job, step, rank), src, sh.Size); err != nil {
		return tiers.ShardEntry{}, fmt.Errorf("agent: push of job %s rank %d step %d to %s: %w", job, rank, step, st, err)
	}
	// The leaf hashes beside it serve ranged reads of the copy; without
	// them it is read whole, so a failure here fails nothing.
	if sh.Leaves != nil {
		if err := tiers.PutLeaves(ctx, st, job, step, rank, sh.Leaves.hashes); err != nil {
			a.log.Warn("the leaf hashes of a tier copy were not written: it will be read whole", "job", job, "rank", rank, "step", step, "tier", st.String(), "err", err)
		}
	}
	if err := a.cfg.Faults.Check(ctx, faultinject.AgentTierUploaded); err != nil {
		return tiers.ShardEntry{}, fmt.Errorf("agent: push of job %s rank %d step %d to %s: %w", job, rank, step, st, err)
	}
	return tiers.ShardEntry{Rank: rank, Size: sh.Size, HeaderChecksum: sh.HeaderSum}, nil
}

// Pull restores one rank's shard of a step from a tier copy into this
// agent's shared memory, through the same prepare/commit path as a save:
// the slot of the rank's latest checkpoint is never used, and the shard is
// committed only after it has been checked against the manifest and its
// own checksums. A corrupt tier copy is an error wrapping shm.ErrCorrupt,
// and nothing is committed.
func (a *Agent) Pull(ctx context.Context, st tiers.Store, man *tiers.Manifest, rank uint32) error {
	return a.pullTier(ctx, st, man, rank, "")
}

// pullTier is Pull; with stage the shard is staged for that restore
// (stage.go), not committed.
func (a *Agent) pullTier(ctx context.Context, st tiers.Store, man *tiers.Manifest, rank uint32, stage string) error {
	if int(rank) >= len(man.Shards) {
		return fmt.Errorf("%w: agent: rank %d not in the manifest of %s step %d", ErrInvalid, rank, man.Job, man.Step)
	}
	e := man.Shards[rank]
	// One copy into a rank's slots from elsewhere at a time: a replica
	// copied meanwhile would otherwise take the slot being written.
	r := a.rank(man.Job, rank, true)
	r.copyMu.Lock()
	defer r.copyMu.Unlock()
	prep, err := a.prepare(ctx, man.Job, rank, man.WorldSize, man.Step, e.Size, true, false, a.epochs.get(man.Job).epoch, true)
	if err != nil {
		return err
	}
	if err := a.getShard(ctx, st, man, rank, prep); err != nil {
		a.dropPrepared(man.Job, rank, prep)
		return err
	}
	if stage != "" {
		ps := PeerShard{Job: man.Job, Rank: rank, WorldSize: man.WorldSize, Step: man.Step, Size: e.Size, HeaderSum: e.HeaderChecksum, Stage: stage}
		err = a.stage(ctx, ps, prep.Slot, prep.Token, false)
	} else {
		_, err = a.Commit(ctx, man.Job, rank, prep.Slot, prep.Token, man.Step, e.HeaderChecksum)
	}
	if err != nil {
		a.dropPrepared(man.Job, rank, prep)
		return err
	}
	a.log.Info("shard pulled from tier", "job", man.Job, "rank", rank, "step", man.Step, "tier", st.String(), "bytes", e.Size)
	return nil
}

// getShard reads rank's shard from a tier copy into the prepared slot,
// checking it against the manifest and its own checksums.
func (a *Agent) getShard(ctx context.Context, st tiers.Store, man *tiers.Manifest, rank uint32, prep PrepareResult) error {
	f, err := a.cfg.FS.OpenFile(prep.Path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("agent: pull of job %s rank %d step %d: %w", man.Job, rank, man.Step, err)
	}
	m, err := shm.Map(f, prep.Size, true)
	f.Close()
	if err != nil {
		return err
	}
	err = tiers.GetShard(ctx, st, man, rank, m.Data, a.cfg.VerifyWorkers)
	m.Close()
	if err != nil {
		return fmt.Errorf("agent: pull of job %s rank %d step %d from %s: %w", man.Job, rank, man.Step, st, err)
	}
	return nil
}

// FetchAttempt is a tier a Fetch tried and why it could not serve.
type FetchAttempt struct {
	Tier string
	Err  error
}

// fetchFailed is the error of a Fetch that no source served: not found
// (the code callers act on), naming every attempt and why on one line.
// The attempts' own errors are text, not wrapped: one that wraps
// ErrInvalid (a source this node has no tier for) must not make the whole
// fetch an invalid argument. A fetch cut short by its caller's deadline
// or cancellation is that, not a missing shard.
func fetchFailed(ctx context.Context, what string, failed []FetchAttempt) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("agent: %s: stopped after %d sources: %w", what, len(failed), err)
	}
	if len(failed) == 0 {
		return fmt.Errorf("%w: agent: %s: no source to try", ErrNotFound, what)
	}
	return fmt.Errorf("%w: agent: %s (%d tried): %s", ErrNotFound, what, len(failed), attemptsText(failed))
}

// attemptsText lists failed attempts on one line: "TIER: ERROR; ...".
func attemptsText(fs []FetchAttempt) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = f.Tier + ": " + strings.Join(strings.Fields(f.Err.Error()), " ")
	}
	return strings.Join(parts, "; ")
}

// FetchResult says where a Fetch found the shard.
type FetchResult struct {
	Step   int64
	Tier   string // "shm" when shared memory already held it
	Size   int64
	Failed []FetchAttempt
	Staged bool // a slot was staged for the fetch's stage
}

// Fetch brings rank's shard of step (the newest the first tier holds when
// step < 0) into shared memory from the agent's tiers, in the order given
// (all of them, nearest first, when names is empty), falling back to
// the next tier on any error, a corrupt byte included. A shard already
// committed in shared memory is not fetched again.
func (a *Agent) Fetch(ctx context.Context, job string, rank uint32, step int64, names []tiers.Name) (FetchResult, error) {
	if err := validateRank(job, rank, 0); err != nil {
		return FetchResult{}, err
	}
	if len(names) == 0 {
		names = tierOrder(a.cfg.Stores)
	}
	if len(names) == 0 {
		return FetchResult{}, fmt.Errorf("%w: agent: node %s has no durable tiers to fetch from", ErrNotFound, a.cfg.Node)
	}
	if step >= 0 {
		if sh, release, err := a.pin(job, rank, step); err == nil {
			release()
			return FetchResult{Step: step, Tier: "shm", Size: sh.Size}, nil
		}
	}
	var res FetchResult
	for _, name := range names {
		size, got, err := a.fetchFrom(ctx, name, job, rank, step, "")
		if err == nil {
			res.Step, res.Tier, res.Size = got, string(name), size
			a.metrics.transfers.WithLabelValues(string(name), "fetch", "ok").Inc()
			a.metrics.tierBytes.WithLabelValues(string(name)).Add(float64(size))
			return res, nil
		}
		a.metrics.transfers.WithLabelValues(string(name), "fetch", "failed").Inc()
		a.log.Warn("fetch from tier failed; trying the next", "job", job, "rank", rank, "step", step, "tier", name, "err", err)
		res.Failed = append(res.Failed, FetchAttempt{Tier: string(name), Err: err})
		if ctx.Err() != nil {
			break
		}
	}
	return res, fetchFailed(ctx, fmt.Sprintf("no tier could restore job %s rank %d%s", job, rank, stepSuffix(step, step < 0)), res.Failed)
}

// fetchFrom pulls from one tier and returns the shard's size and step;
// with stage the shard is staged for that restore, not committed.
func (a *Agent) fetchFrom(ctx context.Context, tier tiers.Name, job string, rank uint32, step int64, stage string) (int64, int64, error) {
	st := a.cfg.Stores[tier]
	if st == nil {
		return 0, 0, fmt.Errorf("%w: node %s has no tier %q", ErrInvalid, a.cfg.Node, tier)
	}
	if step < 0 {
		steps, err := tiers.Steps(ctx, st, job)
		if err != nil {
			return 0, 0, err
		}
		for i := len(steps) - 1; i >= 0 && step < 0; i-- {
			if m, err := tiers.ReadManifest(ctx, st, job, steps[i]); err == nil && m.Holds(rank) {
				step = steps[i]
			}
		}
		if step < 0 {
			return 0, 0, fmt.Errorf("%w: %s holds no copy of job %s rank %d", ErrNotFound, st, job, rank)
		}
	}
	m, err := tiers.ReadManifest(ctx, st, job, step)
	if err != nil {
		return 0, 0, err
	}
	if err := a.pullTier(ctx, st, m, rank, stage); err != nil {
		return 0, 0, err
	}
	return m.Shards[rank].Size, step, nil
}

// VerifyTier reads rank's shard of step back from one of the agent's tiers
// and checks it against the manifest and its own checksums, into memory
// mapped for the purpose (not the Go heap; shards are large). It returns
// the bytes checked; a mismatch of the shard is an error wrapping
// shm.ErrCorrupt, a copy the store does not hold (its manifest or its
// shard missing) one wrapping ErrNotFound. The leaf hashes beside a
// shard that verified whole are checked too (fixTierLeaves), and fail
// nothing.
func (a *Agent) VerifyTier(ctx context.Context, tier tiers.Name, job string, rank uint32, step int64) (int64, error) {
	st := a.cfg.Stores[tier]
	if st == nil {
		return 0, fmt.Errorf("%w: agent: node %s has no tier %q", ErrInvalid, a.cfg.Node, tier)
	}
	m, err := tiers.ReadManifest(ctx, st, job, step)
	if err != nil {
		if tiers.IsNotExist(err) {
			return 0, fmt.Errorf("%w: agent: %s holds no copy of job %s step %d (its manifest is missing)", ErrNotFound, st, job, step)
		}
		return 0, err
	}
	if !m.Holds(rank) {
		return 0, fmt.Errorf("%w: agent: %s holds no shard of job %s rank %d step %d", ErrNotFound, st, job, rank, step)
	}
	size := m.Shards[rank].Size
	buf, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return 0, fmt.Errorf("agent: mapping %d bytes to verify a tier copy: %w", size, err)
	}
	defer unix.Munmap(buf)
	if err := tiers.GetShard(ctx, st, m, rank, buf, a.cfg.VerifyWorkers); err != nil {
		if tiers.IsNotExist(err) { // the manifest names it, the store does not hold it
			return 0, fmt.Errorf("%w: agent: %s copy of job %s rank %d step %d is missing: %w", ErrNotFound, tier, job, rank, step, err)
		}
		return 0, fmt.Errorf("agent: %s copy of job %s rank %d step %d: %w", tier, job, rank, step, err)
	}
	a.fixTierLeaves(ctx, st, m, rank, buf)
	return size, nil
}

// fixTierLeaves checks the leaf hashes beside a tier copy of rank's
// shard, whose bytes b have verified whole, against its header: ranged
// reads trust them. An object that does not decode, or whose hashes do
// not make the header's checksums, is no fault of the shard: it is
// written again from b, and the copy stays a restore source. A copy
// without one is whole as well (it is read whole). Nothing here fails
// the verify; what goes wrong is logged.
func (a *Agent) fixTierLeaves(ctx context.Context, st tiers.Store, m *tiers.Manifest, rank uint32, b []byte) {
	log := a.log.With("job", m.Job, "rank", rank, "step", m.Step, "tier", st.String())
	h, err := shm.DecodeBytes(b)
	if err == nil {
		_, err = tiers.GetLeaves(ctx, st, m.Job, m.Step, rank, h)
	}
	switch {
	case err == nil || tiers.IsNotExist(err):
		return
	case !isCorrupt(err):
		log.Warn("the leaf hashes beside a tier copy that verified whole could not be read", "err", err)
		return
	}
	leaves, ferr := h.VerifyAtLeaves(tiers.BytesReaderAt(b), a.cfg.VerifyWorkers)
	if ferr == nil {
		ferr = tiers.PutLeaves(ctx, st, m.Job, m.Step, rank, leaves)
	}
	if ferr == nil {
		// A deletion of the copy deletes its manifest first, then the
		// shards and leaves: with the manifest gone the leaves just
		// written may have missed it, and go too.
		if _, serr := st.Size(ctx, tiers.ManifestName(m.Job, m.Step)); tiers.IsNotExist(serr) {
			ferr = st.Delete(ctx, tiers.LeavesName(m.Job, m.Step, rank))
		}
	}
	if ferr != nil {
		log.Warn("the leaf hashes beside a tier copy that verified whole are corrupt, and were not written again: ranged reads of it fall back",
			"problem", err, "err", ferr)
		return
	}
	log.Warn("the leaf hashes beside a tier copy that verified whole were corrupt: written again from the shard", "problem", err)
}

// tierNames converts the tier names of a request, which the wire carries
// as strings. An unknown name is left for the caller to report, as a tier
// this node does not have.
func tierNames(ss []string) []tiers.Name {
	if ss == nil {
		return nil
	}
	out := make([]tiers.Name, len(ss))
	for i, s := range ss {
		out[i] = tiers.Name(s)
	}
	return out
}

// tierStrings converts tier names for the wire.
func tierStrings(ns []tiers.Name) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = string(n)
	}
	return out
}
