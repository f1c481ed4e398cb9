package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/transport"
)

// mustRestore checks that the rank's latest checkpoint is step, intact.
func mustRestore(t *testing.T, s *sdk.Session, step int64) {
	t.Helper()
	got, err := s.Restore(ctxT(t))
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if got.Step != step {
		t.Fatalf("restored step %d, want %d", got.Step, step)
	}
	same(t, state(step), got)
}

func TestSaveOverBudgetKeepsPreviousCheckpoint(t *testing.T) {
	c, _ := start(t, func(cfg *agent.Config) { cfg.BudgetBytes = 1 << 20 })
	s := session(t, c, "budget", 0, 1)
	ctx := ctxT(t)
	if err := s.Save(ctx, 1, state(1), nil); err != nil {
		t.Fatal(err)
	}
	big := []sdk.Tensor{tensor("huge", shm.U8, 1, 2<<20)}
	err := s.Save(ctx, 2, big, nil)
	if !errors.Is(err, sdk.ErrResourceExhausted) {
		t.Fatalf("save over budget: %v, want ErrResourceExhausted", err)
	}
	for _, want := range []string{"budget left", "job budget rank 0", "2.0 MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	mustRestore(t, s, 1)
	if err := s.Save(ctx, 2, state(2), nil); err != nil {
		t.Fatalf("a save within budget after a refused one: %v", err)
	}
	mustRestore(t, s, 2)
}

// TestSaveLargerThanFreeTmpfs runs the agent on a small tmpfs of its own and
// fills it, so the refusal comes from the file system's free space.
func TestSaveLargerThanFreeTmpfs(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("cannot mount a small tmpfs here (%v); the free-space check is covered by shm's NoSpaceError tests", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	root := filepath.Join(dir, "shm")
	c, _ := start(t, func(cfg *agent.Config) { cfg.ShmRoot = root })
	s := session(t, c, "tmpfs", 0, 1)
	ctx := ctxT(t)
	if err := s.Save(ctx, 1, state(1), nil); err != nil {
		t.Fatal(err)
	}
	// Another tenant of the tmpfs takes most of it.
	filler, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(filler.Fd()), 0, 0, 6<<20); err != nil {
		t.Fatal(err)
	}
	filler.Close()
	err = s.Save(ctx, 2, []sdk.Tensor{tensor("w", shm.U8, 1, 3<<20)}, nil)
	if !errors.Is(err, sdk.ErrResourceExhausted) {
		t.Fatalf("save larger than free tmpfs: %v, want ErrResourceExhausted", err)
	}
	for _, want := range []string{"free on " + root, "needs 3.0 MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	mustRestore(t, s, 1)
}

// shardPath returns the segment path and header of job/rank at step.
func shardPath(t *testing.T, c *sdk.Client, job string, step int64) (string, *shm.Header) {
	t.Helper()
	shards, err := c.List(ctxT(t), job)
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		if sh.Step == step && sh.State == agentpb.ShardState_SHARD_STATE_COMMITTED {
			data, err := os.ReadFile(sh.Path)
			if err != nil {
				t.Fatal(err)
			}
			h, err := shm.DecodeBytes(data)
			if err != nil {
				t.Fatal(err)
			}
			return sh.Path, h
		}
	}
	t.Fatalf("no committed shard of %s at step %d in %v", job, step, shards)
	return "", nil
}

func TestFlippedByteIsNeverServed(t *testing.T) {
	for name, where := range map[string]func(h *shm.Header) int64{
		"in tensor data":   func(h *shm.Header) int64 { return h.DataStart + h.Tensor("w").Begin + 1234 },
		"in the header":    func(h *shm.Header) int64 { return 40 },
		"in the last byte": func(h *shm.Header) int64 { return h.Size - 1 },
	} {
		t.Run(name, func(t *testing.T) {
			c, _ := start(t, func(cfg *agent.Config) { cfg.VerifyAfterCommit = false })
			s := session(t, c, "flip", 0, 1)
			ctx := ctxT(t)
			for step := int64(1); step <= 2; step++ {
				if err := s.Save(ctx, step, state(step), nil); err != nil {
					t.Fatal(err)
				}
			}
			path, h := shardPath(t, c, "flip", 2)
			testcluster.Flip(t, path, where(h))
			if _, err := s.Restore(ctx); !errors.Is(err, sdk.ErrCorrupt) {
				t.Fatalf("restore of a flipped shard: %v, want ErrCorrupt", err)
			}
			// Never served again: the latest good checkpoint is step 1.
			mustRestore(t, s, 1)
			if _, err := s.RestoreStep(ctx, 2); err == nil {
				t.Fatal("the corrupt step 2 was served")
			}
			shards, _ := c.List(ctx, "flip")
			for _, sh := range shards {
				if sh.Step == 2 && (sh.State != agentpb.ShardState_SHARD_STATE_CORRUPT || sh.Problem == "") {
					t.Fatalf("step 2 listed as %q (%q), want corrupt with the problem", sh.State, sh.Problem)
				}
			}
		})
	}
}

func TestBackgroundVerifyCatchesCorruption(t *testing.T) {
	c, r := start(t, nil)
	s := session(t, c, "scrub", 0, 1)
	ctx := ctxT(t)
	if err := s.Save(ctx, 1, state(1), nil); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the shard verified in the background", func() bool {
		sh, _ := c.List(ctx, "scrub")
		return len(sh) == 1 && sh[0].Verified
	})
	path, h := shardPath(t, c, "scrub", 1)
	testcluster.Flip(t, path, h.DataStart)
	resp, err := c.API().Verify(ctx, &agentpb.VerifyRequest{Job: "scrub", Rank: 0, Step: 1})
	if err != nil || resp.Ok || !strings.Contains(resp.Problem, "checksum") {
		t.Fatalf("verify of a flipped shard: %v, %v; want ok=false naming the checksum", resp, err)
	}
	if _, err := s.Restore(ctx); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("restore after the only shard went bad: %v, want ErrNotFound", err)
	}
	_ = r
}

// writeShard writes a valid shard of state(step) for job/rank 0 at path
// through a fresh mapping, as the SDK would, and returns its header checksum.
func writeShard(t *testing.T, path, job string, step int64) (string, int64) {
	t.Helper()
	ts := state(step)
	specs := make([]shm.TensorSpec, len(ts))
	data := map[string][]byte{}
	for i, x := range ts {
		specs[i] = shm.TensorSpec{Name: x.Name, DType: x.DType, Shape: x.Shape}
		data[x.Name] = x.Data
	}
	l, err := shm.NewLayout(shm.ShardMeta{Job: job, Rank: 0, WorldSize: 1, Step: step}, specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if path == "" {
		return "", l.Size
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := shm.Map(f, l.Size, true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i, x := range l.Tensors {
		dst := m.Data[l.DataStart+x.Begin : l.DataStart+x.End]
		copy(dst, data[x.Name])
		l.SetSum(i, shm.Sum(dst))
	}
	copy(m.Data, l.Header())
	return shm.HeaderSum(l.Header()), l.Size
}

func TestSupersededPrepareCannotCommit(t *testing.T) {
	c, _ := start(t, nil)
	ctx := ctxT(t)
	api := c.API()
	_, size := writeShard(t, "", "sup", 1)
	req := &agentpb.PrepareRequest{Job: "sup", Rank: 0, WorldSize: 1, Step: 1, SizeBytes: uint64(size)}
	first, err := api.Prepare(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// The first writer is presumed dead; a restarted rank prepares again
	// and is given the same unfinished slot.
	second, err := api.Prepare(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if second.Slot != first.Slot {
		t.Fatalf("a second prepare took slot %d instead of reusing the unfinished slot %d", second.Slot, first.Slot)
	}
	sum, _ := writeShard(t, first.Path, "sup", 1)
	_, err = api.Commit(ctx, &agentpb.CommitRequest{Job: "sup", Rank: 0, Slot: first.Slot, Token: first.Token, Step: 1, HeaderChecksum: sum})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "not being written") {
		t.Fatalf("commit by the superseded writer: %v, want FailedPrecondition", err)
	}
	if _, err := api.Commit(ctx, &agentpb.CommitRequest{Job: "sup", Rank: 0, Slot: second.Slot, Token: second.Token, Step: 1, HeaderChecksum: sum}); err != nil {
		t.Fatalf("commit by the current writer: %v", err)
	}
	// A wrong header checksum is refused as corruption.
	third, err := api.Prepare(ctx, &agentpb.PrepareRequest{Job: "sup", Rank: 0, WorldSize: 1, Step: 2, SizeBytes: uint64(size)})
	if err != nil {
		t.Fatal(err)
	}
	writeShard(t, third.Path, "sup", 2)
	_, err = api.Commit(ctx, &agentpb.CommitRequest{Job: "sup", Rank: 0, Slot: third.Slot, Token: third.Token, Step: 2, HeaderChecksum: sum})
	if status.Code(err) != codes.DataLoss {
		t.Fatalf("commit with a wrong header checksum: %v, want DataLoss", err)
	}
	mustRestore(t, session(t, c, "sup", 0, 1), 1)
}

// A reader holding an old step (a tier transfer, a peer's restore) never
// stalls a save: the save gets a segment beside it, and the step being read
// stays intact for as long as the lease lasts.
func TestReadLeaseDoesNotStallSaves(t *testing.T) {
	c, _ := start(t, nil)
	s := session(t, c, "lease", 0, 1)
	ctx := ctxT(t)
	for step := int64(1); step <= 2; step++ {
		if err := s.Save(ctx, step, state(step), nil); err != nil {
			t.Fatal(err)
		}
	}
	open, err := c.API().Open(ctx, &agentpb.OpenRequest{Job: "lease", Rank: 0, Step: 1})
	if err != nil {
		t.Fatal(err)
	}
	for step := int64(3); step <= 6; step++ {
		if err := s.Save(ctx, step, state(step), nil); err != nil {
			t.Fatalf("save of step %d while step 1 is leased: %v", step, err)
		}
	}
	got, err := s.RestoreStep(ctx, 1)
	if err != nil {
		t.Fatalf("the leased step after four more saves: %v", err)
	}
	same(t, state(1), got)
	list, err := c.API().List(ctx, &agentpb.ListRequest{Job: "lease"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Shards) != 3 {
		t.Fatalf("%d segments for 2 slots and one reader, want 3", len(list.Shards))
	}
	c.API().Release(ctx, &agentpb.ReleaseRequest{Lease: open.Lease})
	mustRestore(t, s, 6)
}

// Where the budget leaves no room for a segment beside a reader, the save
// fails with a clear error rather than touching the step being read; a
// reader that never releases loses its lease after the TTL.
func TestReadLeaseWithinBudget(t *testing.T) {
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	size := shardSize(1) // every step's shard has the same size
	c, _ := start(t, func(cfg *agent.Config) { cfg.Clock, cfg.BudgetBytes = fake, uint64(2*size+size/2) })
	s := session(t, c, "lease", 0, 1)
	ctx := ctxT(t)
	for step := int64(1); step <= 2; step++ {
		if err := s.Save(ctx, step, state(step), nil); err != nil {
			t.Fatal(err)
		}
	}
	open, err := c.API().Open(ctx, &agentpb.OpenRequest{Job: "lease", Rank: 0, Step: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(ctx, 3, state(3), nil); !errors.Is(err, sdk.ErrResourceExhausted) {
		t.Fatalf("save beside a reader over the budget: %v, want ErrResourceExhausted", err)
	}
	got, err := s.RestoreStep(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	same(t, state(1), got)
	fake.Step(agent.DefaultConfig().LeaseTTL + time.Second)
	if err := s.Save(ctx, 3, state(3), nil); err != nil {
		t.Fatalf("save after the lease expired: %v", err)
	}
	c.API().Release(ctx, &agentpb.ReleaseRequest{Lease: open.Lease})
	mustRestore(t, s, 3)
}

func TestMetricsServed(t *testing.T) {
	c, r := start(t, func(cfg *agent.Config) { cfg.MetricsAddr = "127.0.0.1:0" })
	s := session(t, c, "metrics", 0, 1)
	if err := s.Save(ctxT(t), 1, state(1), nil); err != nil {
		t.Fatal(err)
	}
	sec := testcluster.TLS(t, testcluster.ReaderID) // a Prometheus's certificate
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, sec.URL(r.Addrs.Metrics, "/metrics"), nil)
	resp, err := sec.HTTPClient(transport.ExpectNode("")).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`rewind_agent_saves_total{result="ok"} 1`, "rewind_agent_shm_bytes", "rewind_agent_committed_shards 1"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestReadStreamsVerifiedBytes reads a shard over the agent's streaming
// Read, as peers will, and checks a corrupt one is refused.
func TestReadStreamsVerifiedBytes(t *testing.T) {
	c, _ := start(t, func(cfg *agent.Config) { cfg.VerifyAfterCommit = false })
	s := session(t, c, "read", 0, 1)
	ctx := ctxT(t)
	if err := s.Save(ctx, 1, []sdk.Tensor{large("w", 3<<20+5)}, nil); err != nil {
		t.Fatal(err)
	}
	path, _ := shardPath(t, c, "read", 1)
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	read := func() ([]byte, error) {
		stream, err := c.API().Read(ctx, &agentpb.ReadRequest{Job: "read", Rank: 0, Step: 1})
		if err != nil {
			return nil, err
		}
		var got []byte
		for {
			chunk, err := stream.Recv()
			if err == io.EOF {
				return got, nil
			}
			if err != nil {
				return got, err
			}
			if chunk.Offset != uint64(len(got)) {
				return got, fmt.Errorf("chunk at offset %d after %d bytes", chunk.Offset, len(got))
			}
			got = append(got, chunk.Data...)
		}
	}
	got, err := read()
	if err != nil || string(got) != string(want) {
		t.Fatalf("streamed %d bytes (%v), the shard has %d; equal: %v", len(got), err, len(want), string(got) == string(want))
	}
	testcluster.Flip(t, path, int64(len(want))-10)
	if _, err := read(); status.Code(err) != codes.DataLoss {
		t.Fatalf("read of a corrupt shard: %v, want DataLoss", err)
	}
}
