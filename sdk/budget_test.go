package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// childBudgetAgent is the test binary as an agent process with a memory
// budget of $REWIND_TEST_BUDGET bytes and a warm segment of
// $REWIND_TEST_WARM bytes, on $REWIND_TEST_SHM and $REWIND_TEST_SOCK,
// until SIGTERM or SIGKILL.
func childBudgetAgent() int {
	cfg := agent.DefaultConfig()
	cfg.Node, cfg.ShmRoot, cfg.Socket = "child", os.Getenv("REWIND_TEST_SHM"), os.Getenv("REWIND_TEST_SOCK")
	cfg.ListenAddr, cfg.MetricsAddr = "", ""
	cfg.Logger = testcluster.Discard()
	budget, err := strconv.ParseUint(os.Getenv("REWIND_TEST_BUDGET"), 10, 64)
	if err != nil {
		return fail(err)
	}
	cfg.BudgetBytes = budget
	if cfg.WarmSegment, err = strconv.ParseInt(os.Getenv("REWIND_TEST_WARM"), 10, 64); err != nil {
		return fail(err)
	}
	a, err := agent.New(cfg)
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := a.Run(ctx, nil); err != nil && ctx.Err() == nil {
		return fail(err)
	}
	return 0
}

func fail(err error) int {
	os.Stderr.WriteString(err.Error() + "\n")
	return 1
}

// budgetAgents returns a fresh shared-memory root and socket, and the
// function that starts an agent process on them with a budget and a warm
// segment of the given bytes (again after a kill).
func budgetAgents(t *testing.T) (socket, root string, spawn func(budget, warm int64) *testcluster.Proc) {
	t.Helper()
	cfg := testcluster.AgentConfig(t)
	spawn = func(budget, warm int64) *testcluster.Proc {
		p := testcluster.Spawn(t, "budget-agent", "REWIND_TEST_SHM="+cfg.ShmRoot, "REWIND_TEST_SOCK="+cfg.Socket,
			"REWIND_TEST_BUDGET="+strconv.FormatInt(budget, 10), "REWIND_TEST_WARM="+strconv.FormatInt(warm, 10))
		testcluster.WaitAgent(t, p, cfg.Socket)
		return p
	}
	return cfg.Socket, cfg.ShmRoot, spawn
}

// segmentBytes sums the sizes of the segment files under root (slots' and
// the warm segment's): what the node's shared memory holds, that the
// agent's budget must account for.
func segmentBytes(t *testing.T, root string) uint64 {
	t.Helper()
	var n uint64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(path, ".safetensors") || strings.HasPrefix(d.Name(), ".warm")) {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += uint64(fi.Size())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// checkUsed fails t unless the agent's budget in use is exactly the bytes
// of the segments under root.
func checkUsed(t *testing.T, c *sdk.Client, root, when string) {
	t.Helper()
	st, err := c.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := segmentBytes(t, root); st.UsedBytes != want {
		t.Fatalf("%s: the agent counts %d bytes of its budget in use, its segments hold %d", when, st.UsedBytes, want)
	}
}

// A save that a rank began and never finished, found by an agent that
// restarted, holds no checkpoint and has no writer left that could
// commit it: under budget pressure its segment goes back to the budget,
// as an expired Prepare's does. The node's other jobs must not be refused
// for good because a job's rank died mid-save and its agent restarted
// since; and the dead rank's committed step stays restorable.
func TestAbandonedSaveFoundAtRestartGoesBackToTheBudget(t *testing.T) {
	size := shardSize(1)
	socket, root, spawn := budgetAgents(t)
	budget := 3*size + size/2
	agentProc := spawn(budget, 0)
	c := testcluster.Dial(t, socket, sdk.Options{CallTimeout: 10 * time.Second})
	ctx := ctxT(t)
	dead := session(t, c, "killed", 0, 1) // the job of the half-writer
	if err := dead.Save(ctx, 1, state(1), nil); err != nil {
		t.Fatal(err)
	}
	p := testcluster.Spawn(t, "half-writer", "REWIND_TEST_SOCK="+socket, "REWIND_TEST_STEP=2")
	if line := p.NextLine(t, 30*time.Second); line != "HALF" {
		t.Fatalf("half-writer did not get half-way: %q", line)
	}
	p.Kill()
	agentProc.Kill()
	spawn(budget, 0)
	c = testcluster.Dial(t, socket, sdk.Options{CallTimeout: 10 * time.Second})
	checkUsed(t, c, root, "after the restart")

	live := session(t, c, "live", 0, 1)
	for step := int64(1); step <= 3; step++ {
		if err := live.Save(ctx, step, state(step+50), nil); err != nil {
			t.Fatalf("save of step %d of another job: %v", step, err)
		}
		checkUsed(t, c, root, "after a save of the other job")
	}
	mustRestoreState(t, live, 3, state(53))
	mustRestoreState(t, session(t, c, "killed", 0, 1), 1, state(1))
}

// A warm segment (shared memory an agent keeps allocated for a restore)
// outlives its agent on tmpfs. The agent started next counts it against
// its budget while it keeps it, and removes it when it does not: started
// with no warm segment, or with no room for one in its budget. Bytes on
// the node's tmpfs that no budget counts would let the agents' segments
// outgrow the memory the operator gave them.
func TestWarmSegmentOfAKilledAgentIsCountedOrRemoved(t *testing.T) {
	const warm = 1 << 20
	socket, root, spawn := budgetAgents(t)
	run := func(budget, warmBytes int64, when string) *testcluster.Proc {
		p := spawn(budget, warmBytes)
		c := testcluster.Dial(t, socket, sdk.Options{CallTimeout: 10 * time.Second})
		s := session(t, c, "warm", 0, 1)
		if err := s.Save(ctxT(t), 1, state(1), nil); err != nil {
			t.Fatal(err)
		}
		// The warm segment is made (or given up) in the background: wait
		// for it to be there, or gone.
		ready := warmBytes > 0 && budget >= warmBytes+2*shardSize(1)
		wait.ForNil(t, time.Minute, fmt.Sprintf("the warm segment there: %v", ready), func() error {
			for _, name := range []string{".warm", ".warm.filling"} {
				_, err := os.Stat(filepath.Join(root, name))
				if there := err == nil; there != (ready && name == ".warm") {
					return fmt.Errorf("%s there: %v (%v)", name, there, err)
				}
			}
			return nil
		})
		checkUsed(t, c, root, when)
		return p
	}
	p := run(4*warm, warm, "with a warm segment")
	p.Kill()
	p = run(4*warm, 0, "restarted with no warm segment")
	p.Kill()
	p = run(4*warm, warm, "restarted with a warm segment again")
	p.Kill()
	run(warm/2, warm, "restarted with no room for the warm segment")
}

// Two jobs share a node's budget. A job that fills it (a large shard
// committed, a Prepare never committed) makes another job's save that
// needs more memory fail with a clear error, and nothing worse: that job's
// newest step stays restorable, and its saves of the size it had go on in
// the segments it holds.
func TestJobFillingTheBudgetLeavesAnotherJobsSaves(t *testing.T) {
	size := shardSize(1)
	budget := 8 * size
	socket, _, spawn := budgetAgents(t)
	spawn(budget, 0)
	c := testcluster.Dial(t, socket, sdk.Options{CallTimeout: 10 * time.Second})
	ctx := ctxT(t)
	steady := session(t, c, "steady", 0, 1)
	for step := int64(1); step <= 2; step++ {
		if err := steady.Save(ctx, step, state(step), nil); err != nil {
			t.Fatal(err)
		}
	}
	hog := session(t, c, "hog", 0, 2)
	big := tensor("w", shm.U8, 1, 3*size)
	if err := hog.Save(ctx, 1, []sdk.Tensor{big}, nil); err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	left := int64(st.BudgetBytes - st.UsedBytes)
	if _, err := c.API().Prepare(ctx, &agentpb.PrepareRequest{Job: "hog", Rank: 1, WorldSize: 2, Step: 1, SizeBytes: uint64(left)}); err != nil {
		t.Fatalf("a prepare of the %d bytes left: %v", left, err)
	}
	for step := int64(3); step <= 5; step++ {
		if err := steady.Save(ctx, step, state(step), nil); err != nil {
			t.Fatalf("save of step %d in a full budget, same size as before: %v", step, err)
		}
	}
	err = steady.Save(ctx, 6, []sdk.Tensor{big}, nil)
	if !errors.Is(err, sdk.ErrResourceExhausted) || !strings.Contains(err.Error(), "budget") {
		t.Fatalf("a larger save in a full budget: %v, want ErrResourceExhausted naming the budget", err)
	}
	mustRestoreState(t, steady, 5, state(5))
	if err := steady.Save(ctx, 6, state(6), nil); err != nil {
		t.Fatalf("save after a refused one: %v", err)
	}
	mustRestoreState(t, steady, 6, state(6))
}
