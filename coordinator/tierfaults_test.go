package coordinator_test

import (
	"bytes"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// bigState is a rank's state of n bytes at step.
func bigState(step int64, n int) []sdk.Tensor {
	w := make([]byte, n)
	for i := 0; i < n; i += 8 {
		w[i] = byte(step)
		w[i+1] = byte(i >> 8)
		w[i+2] = byte(i >> 16)
	}
	return []sdk.Tensor{{Name: "w", DType: shm.F32, Shape: []int64{int64(n / 4)}, Data: w}}
}

// health returns node's report on tier from the coordinator.
func (tc *tierCluster) health(node, tier string) *coordpb.TierHealth {
	tc.t.Helper()
	resp, err := tc.api.TierStatus(ctxT(tc.t), &coordpb.TierStatusRequest{})
	if err != nil {
		tc.t.Fatal(err)
	}
	for _, n := range resp.Nodes {
		for _, h := range n.Tiers {
			if n.Node == node && h.Tier == tier {
				return h
			}
		}
	}
	return &coordpb.TierHealth{}
}

// TestTierObjectStoreRestartMidUpload: MinIO stops in the middle of a
// shard's upload. The agent retries with backoff and the tier shows
// degraded meanwhile; the copy stays "copying" with no manifest; after the
// restart the copy completes, and it restores bit-identical.
func TestTierObjectStoreRestartMidUpload(t *testing.T) {
	const job, size = "upload", 48 << 20
	tc := newTierCluster(t, 1, "s3:every=1,keep=2", func(_ int, cfg *agent.Config) {
		cfg.TransferBandwidth = 16 << 20 // three seconds for the shard: time to stop the server under it
	})
	s, _ := tc.clients[0].Session(job, 0, 1)
	if err := s.Save(ctxT(t), 1, bigState(1, size), nil); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "upload under way", func() bool {
		h := tc.health("node-0", "s3")
		return h.Running > 0 && h.BytesDone > 0
	})
	if err := tc.minio.Stop(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 20*time.Second, "s3 tier degraded while MinIO is down", func() bool {
		h := tc.health("node-0", "s3")
		return h.Degraded && h.Error != ""
	})
	if st := tc.tierStates(job)["s3"]; !slices.Equal(st["copying"], []int64{1}) {
		t.Fatalf("copy while MinIO is down: %v, want step 1 copying", st)
	}
	if err := tc.minio.Start(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 60*time.Second, "copy durable after MinIO restarted", func() bool {
		return slices.Equal(tc.tierStates(job)["s3"]["durable"], []int64{1})
	})
	wait.For(t, 5*time.Second, "s3 tier healthy again", func() bool { return !tc.health("node-0", "s3").Degraded })
	st := tc.storeOf(0, "s3")
	steps, names := onStore(t, st, job)
	if !slices.Equal(steps, []int64{1}) || len(names) != 3 { // the shard, its leaf hashes, the manifest
		t.Fatalf("on MinIO after the restart: steps %v, objects %v", steps, names)
	}
	cfg := testcluster.AgentConfig(t) // a node that lost its memory
	cfg.Node, cfg.Logger = "node-0", slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Stores = map[tiers.Name]tiers.Store{"s3": st}
	r := testcluster.StartAgent(t, cfg)
	if res, err := r.Agent.Fetch(ctxT(t), job, 0, 1, nil); err != nil || res.Tier != "s3" {
		t.Fatalf("fetch from the object store: %+v %v", res, err)
	}
	c := testcluster.Dial(t, cfg.Socket)
	s2, _ := c.Session(job, 0, 1)
	got, err := s2.RestoreStep(ctxT(t), 1)
	if err != nil || !bytes.Equal(got.Tensors[0].Data, bigState(1, size)[0].Data) {
		t.Fatalf("restore of the copy uploaded across the restart: %v", err)
	}
}

// TestTierNVMeFull: the NVMe tier's disk is full. The copy fails with an
// error that says so, the tier shows degraded, the other tier's copy is
// made, and the checkpoints in memory are untouched: restore works and
// training saves on.
func TestTierNVMeFull(t *testing.T) {
	const job, size = "full", 2 << 20
	tc := newTierCluster(t, 1, "nvme:every=1,keep=2;pfs:every=1,keep=2", func(_ int, cfg *agent.Config) {
		dir := strings.TrimPrefix(cfg.Stores["nvme"].String(), "file://")
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
			t.Skipf("cannot mount a small tmpfs here (%v); tiers' own tests cover ENOSPC", err)
		}
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	})
	s, _ := tc.clients[0].Session(job, 0, 1)
	if err := s.Save(ctxT(t), 1, bigState(1, size), nil); err != nil {
		t.Fatal(err)
	}
	tc.waitLatest(job, 1)
	wait.For(t, 10*time.Second, "nvme copy failed, pfs copy durable", func() bool {
		st := tc.tierStates(job)
		return slices.Equal(st["nvme"]["failed"], []int64{1}) && slices.Equal(st["pfs"]["durable"], []int64{1})
	})
	steps, err := tc.api.ListSteps(ctxT(t), &coordpb.ListStepsRequest{Job: job})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range steps.Steps[0].Tiers {
		if c.Tier == "nvme" && !strings.Contains(c.Error, "no space left") {
			t.Fatalf("failed nvme copy says %q, want the disk full", c.Error)
		}
	}
	wait.For(t, 5*time.Second, "nvme tier degraded", func() bool {
		h := tc.health("node-0", "nvme")
		return h.Degraded && strings.Contains(h.Error, "no space left")
	})
	got, err := s.RestoreStep(ctxT(t), 1)
	if err != nil || !bytes.Equal(got.Tensors[0].Data, bigState(1, size)[0].Data) {
		t.Fatalf("restore from memory with the NVMe tier full: %v", err)
	}
	for step := int64(2); step <= 3; step++ {
		if err := s.Save(ctxT(t), step, bigState(step, size), nil); err != nil {
			t.Fatalf("save of step %d with the NVMe tier full: %v", step, err)
		}
	}
	tc.waitLatest(job, 3)
	if h := tc.health("node-0", "pfs"); h.Degraded {
		t.Fatalf("pfs degraded by a full NVMe disk: %v", h)
	}
}
