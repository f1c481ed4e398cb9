package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/shm"
)

// localAgent makes an agent with no coordinator and no listener, its
// shared memory under /dev/shm; mod, if any, adjusts its config.
func localAgent(t *testing.T, mod func(*Config)) *Agent {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "rewind-test-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	cfg := DefaultConfig()
	cfg.Node, cfg.ShmRoot, cfg.Socket = "n", filepath.Join(d, "shm"), filepath.Join(d, "a.sock")
	cfg.ListenAddr, cfg.MetricsAddr, cfg.VerifyAfterCommit = "", "", false
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// epochAgent is a localAgent with its defaults.
func epochAgent(t *testing.T) *Agent { return localAgent(t, nil) }

// saveAsRank prepares and commits step of rank 0 of job j through the
// server's path, as a rank of epoch, and returns the epoch the answer gave.
func (a *Agent) saveAsRank(t *testing.T, step int64, epoch uint64) (uint64, error) {
	t.Helper()
	ctx := context.Background()
	srv := &server{a: a}
	layout, err := shm.NewLayout(shm.ShardMeta{Job: "j", Rank: 0, WorldSize: 1, Step: step}, []shm.TensorSpec{{Name: "w", DType: shm.U8, Shape: []int64{64}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	prep, err := srv.Prepare(ctx, &agentpb.PrepareRequest{Job: "j", Rank: 0, WorldSize: 1, Step: step, SizeBytes: uint64(layout.Size), Epoch: epoch})
	if err != nil {
		return 0, err
	}
	buf := make([]byte, layout.Size)
	data := buf[layout.DataStart+layout.Tensors[0].Begin : layout.DataStart+layout.Tensors[0].End]
	for i := range data {
		data[i] = byte(step)
	}
	layout.SetSum(0, shm.Sum(data))
	copy(buf, layout.Header())
	if err := os.WriteFile(prep.Path, buf, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = srv.Commit(ctx, &agentpb.CommitRequest{Job: "j", Rank: 0, Slot: prep.Slot, Token: prep.Token, Step: step, HeaderChecksum: shm.HeaderSum(layout.Header())})
	return prep.Epoch, err
}

// TestRankOfALeftEpochIsFenced: a rank's first save learns the job's
// epoch; once the agent learns a newer one from pins (it missed the
// re-gang, cut off), the saves its old ranks made past the new epoch's
// step are gone and never served, and the old rank's next save is
// refused with the gang-broken error naming both epochs; a rank of the
// new epoch saves on.
func TestRankOfALeftEpochIsFenced(t *testing.T) {
	a := epochAgent(t)
	a.learnEpoch("j", 3, 10)
	got, err := a.saveAsRank(t, 11, 0)
	if err != nil || got != 3 {
		t.Fatalf("a rank's first save: epoch %d, %v; want epoch 3", got, err)
	}
	if _, err := a.saveAsRank(t, 12, 3); err != nil {
		t.Fatal(err)
	}
	a.learnEpoch("j", 4, 11)
	for _, sh := range a.List("j") {
		if sh.Step == 12 {
			t.Fatalf("step 12 of the left epoch 3 is still held: %+v", sh)
		}
	}
	if _, _, err := a.Open("j", 0, 11, false); err != nil {
		t.Fatalf("step 11, which epoch 4 resumed from: %v", err)
	}
	_, err = a.saveAsRank(t, 12, 3)
	if !errors.Is(err, ErrGangBroken) || !errors.Is(err, ErrFenced) || !strings.Contains(err.Error(), "belongs to epoch 3; the job is at epoch 4") {
		t.Fatalf("the old rank's save: %v, want ErrFenced naming epochs 3 and 4", err)
	}
	if got, err := a.saveAsRank(t, 12, 4); err != nil || got != 4 {
		t.Fatalf("the new rank's save: epoch %d, %v", got, err)
	}
}
