package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"rewind.dev/rewind/internal/miniotest"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

func stateOf(rank uint32, step int64) []sdk.Tensor {
	w := make([]byte, 3<<20+int(rank)*4)
	for i := range w {
		w[i] = byte(i*7) ^ byte(step) ^ byte(rank)
	}
	return []sdk.Tensor{{Name: "w", DType: shm.F32, Shape: []int64{int64(len(w) / 4)}, Data: w}, {Name: "step", DType: shm.I64, Data: make([]byte, 8)}}
}

func s3Store(t *testing.T) tiers.Store {
	srv := miniotest.Start(t)
	cfg := tiers.DefaultS3Config()
	cfg.URL, cfg.Endpoint = "s3://"+srv.Bucket+"/rewind", srv.URL()
	cfg.AccessKey, cfg.SecretKey = tiers.Secret(srv.AccessKey), tiers.Secret(srv.SecretKey)
	cfg.PartSize = 5 << 20
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := tiers.NewS3Store(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestEachTierAloneRestores: three ranks save steps on one node; one step
// is pushed to a file tier and one to the object store, each with its
// manifest; then shared memory is wiped (the node lost), and each tier
// alone brings the newest step it holds back, bit-identical.
func TestEachTierAloneRestores(t *testing.T) {
	const ranks = 3
	stores := map[tiers.Name]tiers.Store{}
	fst, err := tiers.NewFileStore(filepath.Join(t.TempDir(), "nvme"), tiers.NVMeOptions())
	if err != nil {
		t.Fatal(err)
	}
	stores[tiers.NVMe], stores[tiers.S3] = fst, s3Store(t)
	pushed := map[tiers.Name]int64{tiers.NVMe: 2, tiers.S3: 3}

	cfg := testcluster.AgentConfig(t)
	r := testcluster.StartAgent(t, cfg)
	ctx := context.Background()
	c := testcluster.Dial(t, cfg.Socket)
	for step := int64(1); step <= 3; step++ {
		for rank := range uint32(ranks) {
			s, _ := c.Session("tiered", rank, ranks)
			if err := s.Save(ctx, step, stateOf(rank, step), map[string]int64{"step": step}); err != nil {
				t.Fatal(err)
			}
			s.Close()
		}
		for tier, want := range pushed {
			if want != step {
				continue
			}
			man := &tiers.Manifest{Job: "tiered", Step: step, WorldSize: ranks}
			for rank := range uint32(ranks) {
				e, err := r.Agent.Push(ctx, stores[tier], "tiered", rank, step)
				if err != nil {
					t.Fatalf("push to %s: %v", tier, err)
				}
				man.Shards = append(man.Shards, e)
			}
			if err := tiers.WriteManifest(ctx, stores[tier], man); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.Close()
	r.Stop()

	for tier, st := range stores {
		t.Run(string(tier), func(t *testing.T) {
			// A fresh node: empty shared memory.
			cfg := testcluster.AgentConfig(t)
			r := testcluster.StartAgent(t, cfg)
			steps, err := tiers.Steps(ctx, st, "tiered")
			if err != nil || len(steps) != 1 || steps[0] != pushed[tier] {
				t.Fatalf("steps on %s: %v %v", tier, steps, err)
			}
			man, err := tiers.ReadManifest(ctx, st, "tiered", steps[0])
			if err != nil {
				t.Fatal(err)
			}
			c := testcluster.Dial(t, cfg.Socket)
			for rank := range uint32(ranks) {
				if err := r.Agent.Pull(ctx, st, man, rank); err != nil {
					t.Fatalf("pull rank %d from %s: %v", rank, tier, err)
				}
				s, _ := c.Session("tiered", rank, ranks)
				got, err := s.RestoreStep(ctx, man.Step)
				if err != nil {
					t.Fatal(err)
				}
				if string(got.Tensor("w").Data) != string(stateOf(rank, man.Step)[0].Data) || string(got.Objects) != fmt.Sprintf(`{"step":%d}`, man.Step) {
					t.Fatalf("rank %d from %s: restored state differs", rank, tier)
				}
				s.Close()
			}
		})
	}
}

// TestPullOfACorruptTierCopyCommitsNothing: a flipped byte in a tier copy
// is caught before anything is committed, and the rank's checkpoint in
// memory stays the latest.
func TestPullOfACorruptTierCopyCommitsNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pfs")
	st, err := tiers.NewFileStore(dir, tiers.PFSOptions())
	if err != nil {
		t.Fatal(err)
	}
	cfg := testcluster.AgentConfig(t)
	r := testcluster.StartAgent(t, cfg)
	ctx := context.Background()
	c := testcluster.Dial(t, cfg.Socket)
	s, _ := c.Session("rot", 0, 1)
	defer s.Close()
	if err := s.Save(ctx, 5, stateOf(0, 5), nil); err != nil {
		t.Fatal(err)
	}
	e, err := r.Agent.Push(ctx, st, "rot", 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	man := &tiers.Manifest{Job: "rot", Step: 5, WorldSize: 1, Shards: []tiers.ShardEntry{e}}
	if err := tiers.WriteManifest(ctx, st, man); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(ctx, 6, stateOf(0, 6), nil); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, filepath.FromSlash(tiers.ShardName("rot", 5, 0)))
	b, _ := os.ReadFile(path)
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := r.Agent.Pull(ctx, st, man, 0); !errors.Is(err, shm.ErrCorrupt) {
		t.Fatalf("pull of a corrupt tier copy: %v, want ErrCorrupt", err)
	}
	got, err := s.Restore(ctx)
	if err != nil || got.Step != 6 {
		t.Fatalf("after a failed pull the latest is %v (%v), want step 6", got, err)
	}
}

// TestVerifyTierMendsTheLeafHashes: the verify of a tier copy reads the
// leaf hashes beside it too, which ranged reads trust. Hashes that do not
// make the header's checksums fail no verify of a shard that is whole
// (the copy stays a restore source): they are written again from the
// shard. A copy without them is whole (it is read whole); a rotten shard
// is corrupt whatever its hashes.
func TestVerifyTierMendsTheLeafHashes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pfs")
	st, err := tiers.NewFileStore(dir, tiers.PFSOptions())
	if err != nil {
		t.Fatal(err)
	}
	cfg := testcluster.AgentConfig(t)
	cfg.Stores = map[tiers.Name]tiers.Store{tiers.PFS: st}
	r := testcluster.StartAgent(t, cfg)
	ctx := context.Background()
	s, _ := testcluster.Dial(t, cfg.Socket).Session("lv", 0, 1)
	defer s.Close()
	if err := s.Save(ctx, 5, stateOf(0, 5), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Agent.Verify("lv", 0, 5, ""); err != nil { // what makes the leaf hashes pushed beside it
		t.Fatal(err)
	}
	e, err := r.Agent.Push(ctx, st, "lv", 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	if err := tiers.WriteManifest(ctx, st, &tiers.Manifest{Job: "lv", Step: 5, WorldSize: 1, Shards: []tiers.ShardEntry{e}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Agent.VerifyTier(ctx, tiers.PFS, "lv", 0, 5); err != nil {
		t.Fatalf("verify of a whole copy: %v", err)
	}
	path := filepath.Join(dir, filepath.FromSlash(tiers.LeavesName("lv", 5, 0)))
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string][]byte{
		"a hash changed": append(append([]byte(nil), good[:len(good)-1]...), good[len(good)-1]^0x40),
		"no magic":       append([]byte("XXXXXXXX"), good[8:]...),
		"cut short":      good[:len(good)-3],
	} {
		if err := os.WriteFile(path, bad, 0o640); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Agent.VerifyTier(ctx, tiers.PFS, "lv", 0, 5); err != nil {
			t.Fatalf("%s: verify of a whole copy whose leaf hashes are bad: %v, want whole", name, err)
		}
		if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, good) {
			t.Fatalf("%s: leaf hashes after the verify: %d bytes, %v; want them written again", name, len(b), err)
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Agent.VerifyTier(ctx, tiers.PFS, "lv", 0, 5); err != nil {
		t.Fatalf("verify of a copy without leaf hashes: %v", err)
	}
	shard := filepath.Join(dir, filepath.FromSlash(tiers.ShardName("lv", 5, 0)))
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0x40
	if err := os.WriteFile(shard, b, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Agent.VerifyTier(ctx, tiers.PFS, "lv", 0, 5); !errors.Is(err, shm.ErrCorrupt) {
		t.Fatalf("verify of a rotten shard: %v, want ErrCorrupt", err)
	}
}
