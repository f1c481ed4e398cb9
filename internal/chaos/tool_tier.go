package chaos

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// memObject is an object read whole into memory, to flip a byte in.
type memObject []byte

func (m memObject) WriteAt(p []byte, off int64) (int, error) { return copy(m[off:], p), nil }
func (m memObject) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(m)) {
		return 0, fmt.Errorf("chaos: read at %d past %d bytes", off, len(m))
	}
	return copy(p, m[off:]), nil
}

// TierSteps lists the steps of job with a manifest on a tier (a whole
// copy), oldest first.
func TierSteps(ctx context.Context, tier, rawURL, endpoint, job string) ([]int64, error) {
	cfg := tiers.DefaultS3Config()
	cfg.Endpoint = endpoint
	st, err := tiers.Open(tiers.Name(tier), rawURL, cfg)
	if err != nil {
		return nil, fmt.Errorf("chaos: tier-steps: %w", err)
	}
	steps, err := tiers.Steps(ctx, st, job)
	if err != nil {
		return nil, fmt.Errorf("chaos: tier-steps: %s: %w", st, err)
	}
	return steps, nil
}

// CorruptTier flips one byte in the tensor data of rank's shard of step
// on a tier (tier URL as the agent's --tier takes it, endpoint for S3):
// the object is read, changed and put back whole, so that its manifest
// still lists it and only its checksum tells.
func CorruptTier(ctx context.Context, tier, rawURL, endpoint, job string, step int64, rank uint32) (Corrupted, error) {
	cfg := tiers.DefaultS3Config()
	cfg.Endpoint = endpoint
	st, err := tiers.Open(tiers.Name(tier), rawURL, cfg)
	if err != nil {
		return Corrupted{}, fmt.Errorf("chaos: corrupt-tier: %w", err)
	}
	name := tiers.ShardName(job, step, rank)
	size, err := st.Size(ctx, name)
	if errors.Is(err, tiers.ErrNotExist) || errors.Is(err, fs.ErrNotExist) {
		// The tier's retention removed it since it was seen durable: no
		// copy there, good or bad, is what the caller wanted of it.
		return Corrupted{Step: step, Gone: true}, nil
	}
	if err != nil {
		return Corrupted{}, fmt.Errorf("chaos: corrupt-tier: %s on %s: %w", name, st, err)
	}
	obj := make(memObject, size)
	if _, err := st.Get(ctx, name, obj); err != nil {
		return Corrupted{}, fmt.Errorf("chaos: corrupt-tier: %s on %s: %w", name, st, err)
	}
	h, _, err := shm.ReadHeader(obj, size)
	if err != nil {
		return Corrupted{}, fmt.Errorf("chaos: corrupt-tier: %s on %s: %w", name, st, err)
	}
	off := h.DataStart + (size-h.DataStart)/2
	obj[off] ^= 0xff
	if err := st.Put(ctx, name, obj, size); err != nil {
		return Corrupted{}, fmt.Errorf("chaos: corrupt-tier: %s on %s: %w", name, st, err)
	}
	return Corrupted{Step: step, Offset: off}, nil
}
