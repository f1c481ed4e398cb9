package coordinator_test

import (
	"bytes"
	"io"
	"log/slog"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/tiers"
)

// The tests of this file fire the agent's and the coordinator's fault
// points (faultinject.Points) in a real cluster on loopback and check that
// nothing a user relies on is lost: the previous checkpoint stays the
// latest and restorable, no damaged copy is ever used, and a failed step
// is redone.

func injector(t *testing.T, spec string) *faultinject.Injector {
	t.Helper()
	in := faultinject.New(slog.New(slog.NewTextHandler(io.Discard, nil)), 1)
	if err := in.Set(spec); err != nil {
		t.Fatal(err)
	}
	return in
}

func u8(data []byte) []sdk.Tensor {
	return []sdk.Tensor{{Name: "w", DType: shm.U8, Shape: []int64{int64(len(data))}, Data: data}}
}

// TestFaultSaveCutBeforeCommit: a save whose commit fails (after the copy,
// before the commit is recorded), and one whose segment cannot be
// allocated (a full /dev/shm), are errors the training loop sees; the
// previous checkpoint stays the latest and restores bit-identical, and the
// next save succeeds.
func TestFaultSaveCutBeforeCommit(t *testing.T) {
	const job = "cut"
	in := injector(t, "")
	cl := &cluster{t: t}
	cl.addr, cl.stop = startCoordinator(t, t.TempDir(), "127.0.0.1:0")
	cl.dial()
	cl.addAgent(func(cfg *agent.Config) { cfg.Node, cfg.Faults = "node-0", in })
	s, err := cl.clients[0].Session(job, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Save(ctxT(t), 1, u8(rankData(1, 0)), nil); err != nil {
		t.Fatal(err)
	}
	cl.waitLatest(job, 1)
	mustSet(t, in, "agent/shard-copied=1*error(EIO)")
	if err := s.Save(ctxT(t), 2, u8(rankData(2, 0)), nil); err == nil || !strings.Contains(err.Error(), "injected fault at agent/shard-copied") {
		t.Fatalf("save with a failed commit: %v", err)
	}
	// A larger state needs a new segment, and /dev/shm is full.
	mustSet(t, in, "fs/shm/allocate=1*error(ENOSPC)")
	big := bytes.Repeat([]byte{7}, 3<<20)
	if err := s.Save(ctxT(t), 2, u8(big), nil); err == nil || !strings.Contains(err.Error(), "needs 3.0 MiB more") ||
		!strings.Contains(err.Error(), syscall.ENOSPC.Error()) {
		t.Fatalf("save into a full /dev/shm: %v", err)
	}
	cl.waitLatest(job, 1)
	got, err := s.Restore(ctxT(t))
	if err != nil || got.Step != 1 || !bytes.Equal(got.Tensors[0].Data, rankData(1, 0)) {
		t.Fatalf("after two failed saves the latest checkpoint is %v (%v), want step 1 intact", got, err)
	}
	if err := s.Save(ctxT(t), 2, u8(big), nil); err != nil {
		t.Fatalf("save once the faults are spent: %v", err)
	}
	cl.waitLatest(job, 2)
	if h := in.Hits(); h[faultinject.AgentShardCopied] != 1 || h[faultinject.FSShmAllocate] != 1 {
		t.Fatalf("hits %v", h)
	}
}

// TestFaultCoordinatorFailsToRecordConsistent: the coordinator fails to
// store the decision that a step is consistent; the agent's report is
// refused and sent again, and the step becomes consistent once.
func TestFaultCoordinatorFailsToRecordConsistent(t *testing.T) {
	const job = "record"
	in := injector(t, "coordinator/before-consistent=1*error(EIO)")
	cl := &cluster{t: t}
	cl.addr, cl.stop = startCoordinator(t, t.TempDir(), "127.0.0.1:0", func(c *coordinator.Config) { c.Faults = in })
	cl.dial()
	cl.addAgent(func(cfg *agent.Config) { cfg.Node = "node-0" })
	cl.saveStep(job, 1, 1, 0)
	cl.waitLatest(job, 1)
	if h := in.Hits()[faultinject.CoordBeforeConsistent]; h != 1 {
		t.Fatalf("before-consistent fired %d times", h)
	}
	resp, err := cl.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: 1})
	if err != nil || resp.Step.State != coordpb.StepState_STEP_STATE_CONSISTENT {
		t.Fatalf("step 1: %v %v", resp, err)
	}
}

// TestFaultReplicaDamagedInFlight: a replica whose bytes arrive damaged
// (the first two: the commit's order and the scan's may both run) is
// refused by the receiving agent and never indexed; it is ordered again,
// so the step, the job's last (no later save would bring a replica), gets
// its replica whole; so does the next step's.
func TestFaultReplicaDamagedInFlight(t *testing.T) {
	const job, ws = "inflight", 1
	in := injector(t, "agent/replica-received=2*corrupt")
	cl := rackClusterWith(t, 2, func(c *coordinator.Config) { c.Replicas = 1 }, func(_ int, cfg *agent.Config) { cfg.Faults = in })
	cl.saveStep(job, ws, 1, 0)
	cl.waitLatest(job, 1)
	wait.For(t, 10*time.Second, "a damaged replica was refused", func() bool {
		return in.Hits()[faultinject.AgentReplicaReceived] >= 1
	})
	waitReplicas(t, cl, job, 1, ws, 2)
	cl.saveStep(job, ws, 2, 0)
	cl.waitLatest(job, 2)
	waitReplicas(t, cl, job, 2, ws, 2)
	// Every copy indexed re-reads with its checksums.
	for _, step := range []int64{1, 2} {
		v, err := cl.api.VerifyStep(ctxT(t), &coordpb.StepRequest{Job: job, Step: step})
		if err != nil || !v.Ok {
			t.Fatalf("verify step %d: %v %v", step, v, err)
		}
	}
}

// TestFaultReplicaRotsRestoreFallsBack: a replica rots in memory after it
// was checked (node-2 does not verify in the background, so only the
// restore can notice); node-0 loses its memory, and the restore of rank 0
// tries node-2's replica first (same rack), refuses it, and takes
// node-1's.
func TestFaultReplicaRotsRestoreFallsBack(t *testing.T) {
	const job, ws = "rot", 1
	in := injector(t, "agent/replica-stored=corrupt")
	cl := rackClusterWith(t, 3, func(c *coordinator.Config) { c.Replicas = 2 }, func(i int, cfg *agent.Config) {
		if i == 2 {
			cfg.Faults, cfg.VerifyAfterCommit = in, false
		}
	})
	cl.saveStep(job, ws, 1, 0)
	cl.waitLatest(job, 1)
	waitReplicas(t, cl, job, 1, ws, 3)
	cl.loseNode0(job, ws) // node-0 loses its memory and comes back empty
	cl.restoreFallsBackToNode1(job, ws)
}

// restoreAfterFaults starts two nodes (one replica), saves step 1 of job
// on node-0, waits until it is replicated on node-1, and then arms spec
// on node-0's agent, the one a restore of the job targets.
func restoreAfterFaults(t *testing.T, job string, ws uint32, spec string) *cluster {
	t.Helper()
	in := injector(t, "")
	cl := rackClusterWith(t, 2, func(c *coordinator.Config) { c.Replicas = 1 }, func(i int, cfg *agent.Config) {
		if i == 0 {
			cfg.Faults = in
		}
	})
	cl.saveStep(job, ws, 1, 0)
	cl.waitLatest(job, 1)
	waitReplicas(t, cl, job, 1, ws, 2)
	mustSet(t, in, spec)
	return cl
}

// TestFaultRestoreSourceFails: the first source of a restore fails; the
// agent passes to the next source of the plan.
func TestFaultRestoreSourceFails(t *testing.T) {
	const job, ws = "source", 1
	cl := restoreAfterFaults(t, job, ws, "agent/restore-fetched=1*error(EIO)")
	plan, err := cl.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, RequestedBy: "test"})
	if err != nil || !plan.Executed || !plan.Ok {
		t.Fatalf("restore: %v %v", plan, err)
	}
	rp := plan.Ranks[0]
	if rp.Used != "shm:node-1" || len(rp.Failed) != 1 || !strings.Contains(rp.Failed[0], "shm:node-0") || !strings.Contains(rp.Failed[0], "injected fault") {
		t.Fatalf("rank 0 restored from %q after %q, want node-1 after node-0's own copy failed", rp.Used, rp.Failed)
	}
	s, _ := cl.clients[0].Session(job, 0, ws)
	got, err := s.RestoreStep(ctxT(t), 1)
	if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(1, 0)) {
		t.Fatalf("rank 0 after the fallback: %v", err)
	}
}

// TestFaultEverySourceFailsOnce: every source of a restore fails once for
// a reason that is not the copy's (an I/O error on the restoring node:
// agent/restore-fetched, twice): the agent tries them again, the second
// pass restores from the first source, and the step is restored, not
// marked unrestorable. Before, a transient local error on the last source
// spoilt a good step for every later restore.
func TestFaultEverySourceFailsOnce(t *testing.T) {
	const job, ws = "transient", 1
	cl := restoreAfterFaults(t, job, ws, "agent/restore-fetched=2*error(EIO)")
	plan, err := cl.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, RequestedBy: "test"})
	if err != nil || !plan.Executed || !plan.Ok || plan.Step != 1 || len(plan.Skipped) != 0 {
		t.Fatalf("restore: %v %v", plan, err)
	}
	if rp := plan.Ranks[0]; rp.Used != "shm:node-0" || len(rp.Failed) != 2 {
		t.Fatalf("rank 0 restored from %q after %q, want node-0 on the second pass after both sources failed once", rp.Used, rp.Failed)
	}
	s, _ := cl.clients[0].Session(job, 0, ws)
	got, err := s.RestoreStep(ctxT(t), 1)
	if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(1, 0)) {
		t.Fatalf("rank 0 after the second pass: %v", err)
	}
}

// TestFaultRecoveryCutBeforeRegang: a recovery fails at its last step,
// after every shard was placed: the job's watchers are told it failed and
// why, no consistent step is lost, the recovery is tried again and
// re-gangs the job, and the shards placed stay restorable.
func TestFaultRecoveryCutBeforeRegang(t *testing.T) {
	const job, ws = "cutregang", 2
	in := injector(t, "coordinator/before-regang=1*error(EIO)")
	cl := rackClusterWith(t, 3, func(c *coordinator.Config) { c.Replicas, c.Faults = 1, in }, nil)
	events := cl.loseNode1(job, ws)
	ev := nextEvent(t, events)
	if ev.Ok || ev.Kind != coordpb.JobEventKind_JOB_EVENT_KIND_FAILED || !strings.Contains(ev.Error, "injected fault at coordinator/before-regang") {
		t.Fatalf("event: %v", ev)
	}
	if ev := nextEvent(t, events); !ev.Ok || ev.Step != 1 || ev.Placement[1] != "node-2" || !strings.Contains(ev.Reason, "retry 1 of") {
		t.Fatalf("the recovery tried again: %v, want the re-gang at step 1 with rank 1 on node-2", ev)
	}
	cl.waitLatest(job, 1)
	for rank, node := range map[uint32]int{0: 0, 1: 2} {
		s, _ := cl.clients[node].Session(job, rank, ws)
		got, err := s.RestoreStep(ctxT(t), 1)
		if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(1, rank)) {
			t.Fatalf("rank %d on node-%d after the failed recovery: %v", rank, node, err)
		}
	}
}

func mustSet(t *testing.T, in *faultinject.Injector, spec string) {
	t.Helper()
	if err := in.Set(spec); err != nil {
		t.Fatal(err)
	}
}

// TestFaultTierTransfers: uploads that fail are retried, and so is a
// manifest written but failed before its report; a copy the coordinator
// fails to record is failed, and the next step's is durable. Whatever the
// coordinator calls durable is on the store and restores bit-identical
// from it alone.
func TestFaultTierTransfers(t *testing.T) {
	const job = "tierfaults"
	agentIn, coordIn := injector(t, "agent/tier-uploaded=2*error(EIO)"), injector(t, "")
	tc := newTierCluster(t, 1, "nvme:every=1,keep=8;pfs:every=1,keep=8",
		func(_ int, cfg *agent.Config) { cfg.Faults = agentIn }, func(c *coordinator.Config) { c.Faults = coordIn })
	save := func(step int64) {
		tc.saveStep(job, 1, step, 0)
		tc.waitLatest(job, step)
		tc.waitStarted(job, step, []string{"nvme", "pfs"})
		tc.waitTiers(job)
	}
	save(1)
	mustSet(t, agentIn, "agent/tier-manifest-written=1*error(EIO)")
	save(2)
	mustSet(t, coordIn, "coordinator/before-tier-record=1*error(EIO)")
	save(3)
	save(4)
	durable := tc.waitTiers(job)
	for _, tier := range []string{"nvme", "pfs"} {
		if !slices.Contains(durable[tier], 1) || !slices.Contains(durable[tier], 4) {
			t.Fatalf("durable on %s: %v; step 1 (uploads retried) and step 4 (no fault) must be", tier, durable[tier])
		}
	}
	if n := len(durable["nvme"]) + len(durable["pfs"]); n != 7 {
		t.Fatalf("durable copies %v: want 7 of 8, the record fault costing one", durable)
	}
	h := agentIn.Hits()
	if h[faultinject.AgentTierUploaded] != 2 || h[faultinject.AgentTierManifest] != 1 || coordIn.Hits()[faultinject.CoordBeforeTierRecord] != 1 {
		t.Fatalf("hits: agent %v, coordinator %v", h, coordIn.Hits())
	}
	// Shared memory is lost: every durable copy restores from its tier.
	tc.agents[0].Stop()
	cfg := testcluster.AgentConfig(t)
	cfg.Node, cfg.Stores = "node-0", tc.cfgs[0].Stores
	r := testcluster.StartAgent(t, cfg)
	c := testcluster.Dial(t, cfg.Socket)
	s, _ := c.Session(job, 0, 1)
	for tier, steps := range durable {
		for _, step := range steps {
			if _, err := r.Agent.Fetch(ctxT(t), job, 0, step, []tiers.Name{tiers.Name(tier)}); err != nil {
				t.Fatalf("step %d, durable on %s, does not restore from it: %v", step, tier, err)
			}
			got, err := s.RestoreStep(ctxT(t), step)
			if err != nil || !bytes.Equal(got.Tensors[0].Data, rankData(step, 0)) {
				t.Fatalf("step %d restored from %s: %v", step, tier, err)
			}
		}
	}
}

// TestFaultAgentCrashBeforeReport: the agent process exits right after it
// recorded a commit and before it told the coordinator. The save's caller
// sees an error, but the shard is committed on the node: the restarted
// agent re-indexes shared memory and re-sends its inventory, and the step
// becomes consistent and restores bit-identical.
func TestFaultAgentCrashBeforeReport(t *testing.T) {
	const job = "unreported"
	cl := &cluster{t: t}
	cl.addr, cl.stop = startCoordinator(t, t.TempDir(), "127.0.0.1:0")
	cl.dial()
	p, spec := cl.spawnAgent("node-0", "rack-a", "", faultinject.EnvSpec+"=agent/committed-unreported=1*exit(137)")
	s, err := cl.clients[0].Session(job, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(ctxT(t), 1, u8(rankData(1, 0)), nil); err == nil {
		t.Fatal("a save whose agent died during the commit returned no error")
	}
	if err := p.Wait(); err == nil || p.Cmd.ProcessState.ExitCode() != 137 {
		t.Fatalf("the agent exited with %v, want status 137 from the fault point", err)
	}
	if l, err := cl.api.Latest(ctxT(t), &coordpb.LatestRequest{Job: job}); err == nil && l.Step >= 0 {
		t.Fatalf("the coordinator knows step %d although the only commit was never reported", l.Step)
	}
	testcluster.SpawnAgent(t, spec) // the same node, shm root and socket; no faults
	c := testcluster.Dial(t, spec.Socket)
	cl.waitLatest(job, 1)
	s2, _ := c.Session(job, 0, 1)
	got, err := s2.Restore(ctxT(t))
	if err != nil || got.Step != 1 || !bytes.Equal(got.Tensors[0].Data, rankData(1, 0)) {
		t.Fatalf("restore after the agent's restart: %v %v", got, err)
	}
}
