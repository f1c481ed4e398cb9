package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/segsock"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// The test binary doubles as the processes these tests kill: an agent
// (testcluster's role), and a rank that dies between Prepare and Commit.
func TestMain(m *testing.M) {
	testcluster.Main(m, map[string]testcluster.Role{"half-writer": childHalfWriter, "budget-agent": childBudgetAgent})
}

// childHalfWriter prepares a save of step REWIND_TEST_STEP, writes half of
// its bytes into the segment, says HALF and waits to be killed.
func childHalfWriter() int {
	ctx := context.Background()
	c, err := sdk.Dial(ctx, os.Getenv("REWIND_TEST_SOCK"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	step, _ := strconv.ParseInt(os.Getenv("REWIND_TEST_STEP"), 10, 64)
	size := shardSize(step)
	prep, err := c.API().Prepare(ctx, &agentpb.PrepareRequest{Job: "killed", Rank: 0, WorldSize: 1, Step: step, SizeBytes: uint64(size)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f, err := segmentOf(os.Getenv("REWIND_TEST_SOCK"), &agentpb.SegmentRequest{Job: "killed", Slot: prep.Slot,
		Grant: &agentpb.SegmentRequest_SaveToken{SaveToken: prep.Token}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m, err := shm.Map(f, size, true)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	junk := pattern(uint64(step), int(size/2))
	copy(m.Data, junk) // a torn write: half of a shard, header and all
	fmt.Println("HALF")
	testcluster.Hang() // mid-save, until the test kills it
	return 0
}

// segmentOf asks the agent's segment socket for a segment, as a rank
// does: the shared-memory root is the agent's alone.
func segmentOf(socket string, req *agentpb.SegmentRequest) (*os.File, error) {
	c, err := net.Dial(segsock.Network, segsock.Path(socket))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if err := segsock.Write(c.(*net.UnixConn), req, nil); err != nil {
		return nil, err
	}
	var resp agentpb.SegmentResponse
	files, err := segsock.Read(c.(*net.UnixConn), &resp)
	if err != nil {
		return nil, err
	}
	if resp.Code != 0 || len(files) != 1 {
		return nil, fmt.Errorf("segment refused: %s (%d descriptors)", resp.Error, len(files))
	}
	return files[0], nil
}

func shardSize(step int64) int64 {
	var specs []shm.TensorSpec
	for _, x := range state(step) {
		specs = append(specs, shm.TensorSpec{Name: x.Name, DType: x.DType, Shape: x.Shape})
	}
	l, err := shm.NewLayout(shm.ShardMeta{Job: "killed", Rank: 0, WorldSize: 1, Step: step}, specs, nil)
	if err != nil {
		panic(err)
	}
	return l.Size
}

func TestSaveKilledBetweenPrepareAndCommit(t *testing.T) {
	c, r := start(t, nil)
	s := session(t, c, "killed", 0, 1)
	ctx := ctxT(t)
	for step := int64(1); step <= 2; step++ {
		if err := s.Save(ctx, step, state(step), nil); err != nil {
			t.Fatal(err)
		}
	}
	// Twice, so the torn save lands in each of the two slots in turn.
	for _, torn := range []int64{3, 4} {
		p := testcluster.Spawn(t, "half-writer", "REWIND_TEST_SOCK="+r.Config.Socket, "REWIND_TEST_STEP="+strconv.FormatInt(torn, 10))
		if line := p.NextLine(t, 30*time.Second); line != "HALF" {
			t.Fatalf("half-writer did not get half-way: %q", line)
		}
		p.Kill()
		latest := torn - 1
		mustRestore(t, s, latest)
		if got, ok, err := s.Latest(ctx); err != nil || !ok || got != latest {
			t.Fatalf("Latest after a torn save of %d: %d %v %v", torn, got, ok, err)
		}
		// The next save goes through, into the abandoned slot or the other.
		if err := s.Save(ctx, torn, state(torn), nil); err != nil {
			t.Fatalf("save after a torn save: %v", err)
		}
		mustRestore(t, s, torn)
	}
}

func TestAgentKilledAndRestartedServesCheckpoints(t *testing.T) {
	cfg := testcluster.AgentConfig(t)
	spec := testcluster.AgentProcess{Node: "child", ShmRoot: cfg.ShmRoot, Socket: cfg.Socket, Logs: true}
	agentProc := testcluster.SpawnAgent(t, spec)
	c := testcluster.Dial(t, cfg.Socket, sdk.Options{CallTimeout: 5 * time.Second})
	ctx := ctxT(t)
	ranks := []uint32{0, 1}
	for _, rank := range ranks {
		s := session(t, c, "survivor", rank, 2)
		for step := int64(1); step <= 3; step++ {
			if err := s.Save(ctx, step, state(step+int64(rank)*100), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A third job's only shard is corrupted while the agent is down.
	one := session(t, c, "bitrot", 0, 1)
	if err := one.Save(ctx, 9, state(9), nil); err != nil {
		t.Fatal(err)
	}
	rotPath, rotHeader := shardPath(t, c, "bitrot", 9)
	agentProc.Kill()
	testcluster.Flip(t, rotPath, rotHeader.DataStart+5)

	testcluster.SpawnAgent(t, spec)
	c2 := testcluster.Dial(t, cfg.Socket, sdk.Options{CallTimeout: 5 * time.Second})
	for _, rank := range ranks {
		s := session(t, c2, "survivor", rank, 2)
		got, err := s.Restore(ctx)
		if err != nil {
			t.Fatalf("rank %d after agent restart: %v", rank, err)
		}
		if got.Step != 3 {
			t.Fatalf("rank %d restored step %d after agent restart, want 3", rank, got.Step)
		}
		same(t, state(3+int64(rank)*100), got)
		older, err := s.RestoreStep(ctx, 2)
		if err != nil {
			t.Fatalf("rank %d step 2 after agent restart: %v", rank, err)
		}
		same(t, state(2+int64(rank)*100), older)
		// Saves continue and never overwrite the latest step.
		if err := s.Save(ctx, 4, state(4+int64(rank)*100), nil); err != nil {
			t.Fatal(err)
		}
		mustRestoreState(t, s, 4, state(4+int64(rank)*100))
	}
	if _, err := session(t, c2, "bitrot", 0, 1).Restore(ctx); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("restore of a shard corrupted while the agent was down: %v, want ErrNotFound (never served)", err)
	}
	shards, _ := c2.List(ctx, "bitrot")
	if len(shards) != 1 || shards[0].State != agentpb.ShardState_SHARD_STATE_CORRUPT {
		t.Fatalf("bitrot shard listed as %v, want corrupt", shards)
	}
}

func mustRestoreState(t *testing.T, s *sdk.Session, step int64, want []sdk.Tensor) {
	t.Helper()
	got, err := s.Restore(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if got.Step != step {
		t.Fatalf("restored step %d, want %d", got.Step, step)
	}
	same(t, want, got)
}
