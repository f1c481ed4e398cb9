package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"

	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// Push copies a committed shard to a tier straight from its segment: the
// store reads the mapping (no copy into the Go heap). The shard is verified
// before it leaves and pinned while it is read, so a save cannot reuse its
// slot meanwhile. It returns the shard's manifest entry.
func (a *Agent) Push(ctx context.Context, st tiers.Store, job string, rank uint32, step int64) (tiers.ShardEntry, error) {
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
	if err := st.Put(ctx, tiers.ShardName(job, step, rank), bytes.NewReader(m.Data), sh.Size); err != nil {
		return tiers.ShardEntry{}, fmt.Errorf("agent: push of job %s rank %d step %d to %s: %w", job, rank, step, st, err)
	}
	a.log.Info("shard pushed to tier", "job", job, "rank", rank, "step", step, "tier", st.String(), "bytes", sh.Size)
	return tiers.ShardEntry{Rank: rank, Size: sh.Size, HeaderChecksum: sh.HeaderSum}, nil
}

// Pull restores one rank's shard of a step from a tier copy into this
// agent's shared memory, through the same prepare/commit path as a save:
// the slot of the rank's latest checkpoint is never used, and the shard is
// committed only after it has been checked against the manifest and its
// own checksums. A corrupt tier copy is an error wrapping shm.ErrCorrupt,
// and nothing is committed.
func (a *Agent) Pull(ctx context.Context, st tiers.Store, man *tiers.Manifest, rank uint32) error {
	if int(rank) >= len(man.Shards) {
		return fmt.Errorf("%w: agent: rank %d not in the manifest of %s step %d", ErrInvalid, rank, man.Job, man.Step)
	}
	e := man.Shards[rank]
	prep, err := a.Prepare(ctx, man.Job, rank, man.WorldSize, man.Step, e.Size)
	if err != nil {
		return err
	}
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
	if _, err := a.Commit(ctx, man.Job, rank, prep.Slot, prep.Token, man.Step, e.HeaderChecksum); err != nil {
		return err
	}
	a.log.Info("shard pulled from tier", "job", man.Job, "rank", rank, "step", man.Step, "tier", st.String(), "bytes", e.Size)
	return nil
}
