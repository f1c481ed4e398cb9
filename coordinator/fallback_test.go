package coordinator_test

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/tiers"
)

// The policy of issue 18's reproduction: every step to each node's NVMe
// and to the shared filesystem, four kept on each.
const fallbackPolicy = "nvme:every=1,keep=4;pfs:every=1,keep=4"

// fileTierCluster is a coordinator and agents on loopback, each agent with
// a file tier as its NVMe (a directory of its own) and one shared
// directory as the parallel filesystem; no object store.
func fileTierCluster(t *testing.T, nodes int, policy string, mods ...func(node int, cfg *agent.Config)) *tierCluster {
	p, err := tiers.ParsePolicy(policy)
	if err != nil {
		t.Fatal(err)
	}
	tc := &tierCluster{cluster: &cluster{t: t, dataDir: filepath.Join(t.TempDir(), "coord")}, pfs: filepath.Join(t.TempDir(), "pfs")}
	tc.addr, tc.stop = startCoordinator(t, tc.dataDir, "127.0.0.1:0", func(c *coordinator.Config) { c.Policy = p })
	tc.dial()
	tc.storeOf = func(node int, tier string) tiers.Store {
		dir, opts := tc.pfs, tiers.PFSOptions()
		if tier == "nvme" {
			dir, opts = tc.nvme[node], tiers.NVMeOptions()
		}
		st, err := tiers.NewFileStore(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	for i := range nodes {
		tc.nvme = append(tc.nvme, filepath.Join(t.TempDir(), fmt.Sprintf("nvme-%d", i)))
		tc.addAgent(func(cfg *agent.Config) {
			cfg.Node = fmt.Sprintf("node-%d", i)
			cfg.Stores = map[tiers.Name]tiers.Store{"nvme": tc.storeOf(i, "nvme"), "pfs": tc.storeOf(i, "pfs")}
			cfg.TransferBackoff = 50 * time.Millisecond
			for _, mod := range mods {
				mod(i, cfg)
			}
			tc.cfgs = append(tc.cfgs, *cfg)
		})
	}
	tc.waitOrderStreams()
	return tc
}

// saveOnTiers saves steps first to last of ranks 0 and 1 of job (rank r
// on node r), each waited for until consistent and copied to both tiers.
func (tc *tierCluster) saveOnTiers(job string, first, last int64) {
	tc.t.Helper()
	for step := first; step <= last; step++ {
		tc.saveStep(job, 2, step, 0, 1)
		tc.waitLatest(job, step)
		tc.waitStarted(job, step, []string{"nvme", "pfs"})
		tc.waitTiers(job)
	}
}

// corruptRank flips one data byte in every tier copy of rank's shard of
// step: on the NVMe of the rank's node and on the shared filesystem.
func (tc *tierCluster) corruptRank(job string, step int64, rank uint32) {
	name := filepath.FromSlash(tiers.ShardName(job, step, rank))
	testcluster.Flip(tc.t, filepath.Join(tc.nvme[rank], name), -100)
	testcluster.Flip(tc.t, filepath.Join(tc.pfs, name), -100)
}

// restartAgents stops the first n agents, wipes their shared memory (new,
// empty roots) and starts them again under the same names, with the same
// tiers; it returns once the coordinator has taken their empty memories
// in (no restore plan of step names a copy in memory).
func (tc *tierCluster) restartAgents(job string, n int, step int64) {
	t := tc.t
	t.Helper()
	for i := range n {
		tc.agents[i].Stop()
		tc.clients[i].Close()
		cfg := testcluster.AgentConfig(t)
		cfg.Node, cfg.CoordinatorAddr, cfg.Stores = tc.cfgs[i].Node, tc.addr, tc.cfgs[i].Stores
		cfg.TransferBackoff, cfg.Logger = tc.cfgs[i].TransferBackoff, testcluster.Discard()
		tc.agents[i] = startAgent(t, cfg)
		tc.clients[i] = testcluster.Dial(t, cfg.Socket)
	}
	wait.ForNil(t, 10*time.Second, "the restarted agents' empty memories in the index", func() error {
		plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: step, DryRun: true})
		if err != nil {
			return err
		}
		for _, rp := range plan.Ranks {
			for _, s := range rp.Sources {
				if s.Tier == "shm" {
					return fmt.Errorf("rank %d still planned from %s:%s", rp.Rank, s.Tier, s.Node)
				}
			}
		}
		return nil
	})
}

// corruptStep5 is issue 18's reproduction up to the restore: two agents,
// each with its NVMe and the shared filesystem, save steps 0 to 5; one
// data byte is flipped in every tier copy of rank 0's step 5; the agents
// are stopped, their shared memory wiped, and started again.
func corruptStep5(t *testing.T, job string) *tierCluster {
	tc := fileTierCluster(t, 2, fallbackPolicy)
	tc.saveOnTiers(job, 0, 5)
	if got := tc.waitTiers(job); !slices.Equal(got["nvme"], []int64{2, 3, 4, 5}) || !slices.Equal(got["pfs"], []int64{2, 3, 4, 5}) {
		t.Fatalf("durable tier copies: %v", got)
	}
	tc.corruptRank(job, 5, 0)
	tc.restartAgents(job, 2, 5)
	return tc
}

// checkSkippedStep5 checks that a restore says it passed over step 5
// because rank 0's copies on node-0's NVMe and the shared filesystem are
// corrupt, and names nothing else.
func checkSkippedStep5(t *testing.T, skipped []*coordpb.UnrestorableStep) {
	t.Helper()
	if len(skipped) != 1 || skipped[0].Step != 5 || len(skipped[0].Ranks) != 1 || skipped[0].Ranks[0].Rank != 0 {
		t.Fatalf("steps passed over: %v, want step 5 for rank 0", skipped)
	}
	var copies []string
	for _, c := range skipped[0].Ranks[0].Copies {
		if !c.Corrupt || !strings.Contains(c.Error, "corrupt") {
			t.Errorf("copy %s: %q, corrupt %v; want a checksum mismatch", c.Copy, c.Error, c.Corrupt)
		}
		copies = append(copies, c.Copy)
	}
	if slices.Sort(copies); !slices.Equal(copies, []string{"nvme:node-0", "pfs:-"}) {
		t.Fatalf("rank 0's copies named: %v, want nvme:node-0 and pfs:-", copies)
	}
}

// checkRestoredAt checks that every rank of the 2-rank job restores step,
// bit-identical, on the node given, and that the job's latest consistent
// step (what a restarted rank restores) is step.
func (tc *tierCluster) checkRestoredAt(job string, step int64, nodes map[uint32]int) {
	t := tc.t
	t.Helper()
	tc.waitLatest(job, step)
	for rank, node := range nodes {
		s, err := tc.clients[node].Session(job, rank, 2)
		if err != nil {
			t.Fatal(err)
		}
		// A rank started before its agent has heard the restart's resume
		// order is told its gang is broken, and is started again (as the
		// driver does on the error): retried here until the order lands.
		var got *sdk.Checkpoint
		wait.ForNil(t, 10*time.Second, fmt.Sprintf("rank %d's agent to hear the resume order", rank), func() error {
			got, err = s.Restore(ctxT(t))
			if errors.Is(err, sdk.ErrGangBroken) {
				return err
			}
			return nil
		})
		if err != nil || got.Step != step || !bytes.Equal(got.Tensors[0].Data, rankData(step, rank)) {
			t.Fatalf("rank %d on node-%d: %v (step %v), want step %d bit-identical", rank, node, err, got != nil && got.Step == step, step)
		}
		s.Close()
	}
}

// TestRestoreFallsBackPastACorruptStep is issue 18's reproduction: every
// tier copy of rank 0's step 5 is corrupt and memory is lost. `rewind
// restore JOB` (a restart) stages step 5, finds rank 0 unrestorable from
// either copy, switches nothing, marks the step and the copies, and falls
// back to step 4, intact everywhere: every rank lands at step 4,
// bit-identical, and the answer and the job's event say why step 5 was
// passed over, naming rank 0's copies.
func TestRestoreFallsBackPastACorruptStep(t *testing.T) {
	const job = "issue18"
	tc := corruptStep5(t, job)
	events := tc.watch(job)
	plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, RequestedBy: "test via rewind restore", Restart: true})
	if err != nil || !plan.Ok || !plan.Restarted || plan.Step != 4 {
		t.Fatalf("restore: step %d ok %v restarted %v, %v; want step 4 restored and restarted (plan %v)", plan.GetStep(), plan.GetOk(), plan.GetRestarted(), err, plan)
	}
	checkSkippedStep5(t, plan.Skipped)
	if !slices.Contains(plan.DroppedSteps, 5) {
		t.Fatalf("steps deleted by the restart: %v, want step 5 among them", plan.DroppedSteps)
	}
	ev := nextEvent(t, events)
	if !ev.Ok || ev.Step != 4 {
		t.Fatalf("the job's event: %v", ev)
	}
	checkSkippedStep5(t, ev.Skipped)
	tc.checkRestoredAt(job, 4, map[uint32]int{0: 0, 1: 1})
}

// TestRestoreWithoutRestartMarksTheCorruptStep: the same restore with
// --no-restart. Step 5 stays in the index, marked unrestorable with rank
// 0's copies, which show as corrupt (and their tier copies as corrupt,
// not durable); no node's memory holds step 5 (rank 1's staged shard was
// dropped); a retry plans step 4 at once, also after a coordinator
// restart; and retention removes the corrupt copies once the job saves on.
func TestRestoreWithoutRestartMarksTheCorruptStep(t *testing.T) {
	const job = "issue18-norestart"
	tc := corruptStep5(t, job)
	plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, RequestedBy: "test"})
	if err != nil || !plan.Ok || plan.Step != 4 {
		t.Fatalf("restore: %v %v; want step 4", plan, err)
	}
	checkSkippedStep5(t, plan.Skipped)
	tc.checkRestoredAt(job, 4, map[uint32]int{0: 0, 1: 1})

	st, err := tc.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: 5})
	if err != nil {
		t.Fatal(err)
	}
	checkSkippedStep5(t, []*coordpb.UnrestorableStep{st.Step.Unrestorable})
	bad := map[string]bool{}
	for _, c := range st.Step.Copies {
		if c.State == coordpb.CopyState_COPY_STATE_CORRUPT {
			bad[fmt.Sprintf("%d %s:%s", c.Rank, c.Tier, c.Node)] = true
		}
	}
	if len(bad) != 2 || !bad["0 nvme:node-0"] || !bad["0 pfs:-"] {
		t.Fatalf("copies of step 5 shown corrupt: %v", bad)
	}
	for _, tcp := range st.Step.Tiers {
		if tcp.State != coordpb.TierCopyState_TIER_COPY_STATE_CORRUPT || !strings.Contains(tcp.Error, "rank 0") {
			t.Fatalf("step 5 on %s: %s (%s), want corrupt naming rank 0", tcp.Tier, tcp.State.Label(), tcp.Error)
		}
	}
	for node, c := range tc.clients {
		shards, err := c.List(ctxT(t), job)
		if err != nil {
			t.Fatal(err)
		}
		for _, sh := range shards {
			if sh.Step == 5 || sh.State != agentpb.ShardState_SHARD_STATE_COMMITTED {
				t.Fatalf("node-%d holds %s step %d of rank %d after the restore", node, sh.State.Label(), sh.Step, sh.Rank)
			}
		}
	}
	again, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, DryRun: true})
	if err != nil || again.Step != 4 {
		t.Fatalf("a retry plans %v %v, want step 4", again, err)
	}
	checkSkippedStep5(t, again.Skipped)
	v, err := tc.api.VerifyStep(ctxT(t), &coordpb.StepRequest{Job: job, Step: 5})
	if err != nil || v.Ok {
		t.Fatalf("verify of step 5: %v %v, want it to fail", v, err)
	}
	// The marks are in the coordinator's store: a restarted coordinator
	// still passes over step 5.
	tc.stop()
	tc.addr, tc.stop = startCoordinator(t, tc.dataDir, tc.addr, func(c *coordinator.Config) { c.Policy, _ = tiers.ParsePolicy(fallbackPolicy) })
	again, err = tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, DryRun: true})
	if err != nil || again.Step != 4 {
		t.Fatalf("after a coordinator restart a retry plans %v %v, want step 4", again, err)
	}
	checkSkippedStep5(t, again.Skipped)
	if st, err := tc.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: 5}); err != nil || len(st.Step.Tiers) != 2 ||
		st.Step.Tiers[0].State != coordpb.TierCopyState_TIER_COPY_STATE_CORRUPT {
		t.Fatalf("step 5 after a coordinator restart: %v %v", st, err)
	}
	// The job saves on from step 4; once step 6 is durable, retention
	// removes the corrupt copies of step 5 (not counted among those kept)
	// from the index and from the tiers.
	tc.saveOnTiers(job, 6, 6)
	if got := tc.waitTiers(job); !slices.Equal(got["nvme"], []int64{2, 3, 4, 6}) || !slices.Equal(got["pfs"], []int64{2, 3, 4, 6}) {
		t.Fatalf("durable tier copies after step 6: %v", got)
	}
	wait.ForNil(t, 10*time.Second, "retention to remove step 5's corrupt copies", func() error {
		if _, err := tc.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: 5}); err == nil {
			st, _ := tc.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: 5})
			return fmt.Errorf("step 5 still in the index: %v", st)
		}
		for _, st := range []tiers.Store{tc.storeOf(0, "nvme"), tc.storeOf(0, "pfs")} {
			if steps, _ := onStore(t, st, job); slices.Contains(steps, 5) {
				return fmt.Errorf("%s still holds step 5", st)
			}
		}
		return nil
	})
}

// TestRestoreSwitchesNothingWhenNoStepIsRestorable: every tier copy of
// rank 0 is corrupt at every step and memory is lost. The restore tries
// each step newest first, switches none, and fails naming every step, the
// rank and each copy; no node's memory holds a shard of the job (staged
// or committed), no step is deleted, and the job's ranks were never told
// their gang is broken.
func TestRestoreSwitchesNothingWhenNoStepIsRestorable(t *testing.T) {
	const job = "nothing"
	tc := fileTierCluster(t, 2, fallbackPolicy)
	tc.saveOnTiers(job, 0, 5)
	for step := int64(2); step <= 5; step++ {
		tc.corruptRank(job, step, 0)
	}
	tc.restartAgents(job, 2, 5)
	plan, err := tc.api.PlanRestore(ctxT(t), &coordpb.PlanRestoreRequest{Job: job, Step: -1, RequestedBy: "test", Restart: true})
	if err == nil {
		t.Fatalf("restore with no restorable step: %v", plan)
	}
	for _, want := range []string{"no restorable step", "step 5 (rank 0: ", "step 4 (rank 0: ", "step 3 (rank 0: ", "step 2 (rank 0: ",
		"nvme:node-0 corrupt", "pfs:- corrupt"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if strings.Count(err.Error(), "nvme:node-0 corrupt") != 4 || strings.Count(err.Error(), "pfs:- corrupt") != 4 || strings.Contains(err.Error(), "rank 1") {
		t.Errorf("error does not name rank 0's two copies of each of the four steps, and only those: %v", err)
	}
	for node, c := range tc.clients {
		if shards, err := c.List(ctxT(t), job); err != nil || len(shards) != 0 {
			t.Fatalf("node-%d holds %d shards of the job after the failed restore: %v %v", node, len(shards), shards, err)
		}
	}
	steps, err := tc.api.ListSteps(ctxT(t), &coordpb.ListStepsRequest{Job: job})
	if err != nil || len(steps.Steps) != 4 {
		t.Fatalf("steps after the failed restore: %v %v, want 2 to 5 still there", steps, err)
	}
	for _, st := range steps.Steps {
		if st.Unrestorable == nil {
			t.Errorf("step %d not marked unrestorable", st.Step)
		}
	}
	// No abort was sent: rank 1 saves on.
	tc.saveStep(job, 2, 6, 1)
}

// TestRecoveryFallsBackPastACorruptStep: the automatic path. Node-0 dies
// with its memory and its NVMe; the only other copy of rank 0's step 5,
// on the shared filesystem, is corrupt. The recovery stages step 5 on the
// spare node, finds rank 0 unrestorable, and re-gangs the job at step 4,
// its event naming step 5 and the copy.
func TestRecoveryFallsBackPastACorruptStep(t *testing.T) {
	const job = "recover18"
	tc := fileTierCluster(t, 3, fallbackPolicy)
	tc.saveOnTiers(job, 0, 5)
	testcluster.Flip(t, filepath.Join(tc.pfs, filepath.FromSlash(tiers.ShardName(job, 5, 0))), -100)
	events := tc.watch(job)
	tc.agents[0].Stop()
	if _, err := tc.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-0", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events)
	if !ev.Ok || ev.Step != 4 || ev.Placement[0] != "node-2" || ev.Placement[1] != "node-1" {
		t.Fatalf("recovery event: %v, want a re-gang at step 4 with rank 0 on node-2", ev)
	}
	if len(ev.Skipped) != 1 || ev.Skipped[0].Step != 5 || len(ev.Skipped[0].Ranks) != 1 || ev.Skipped[0].Ranks[0].Rank != 0 ||
		len(ev.Skipped[0].Ranks[0].Copies) != 1 || ev.Skipped[0].Ranks[0].Copies[0].Copy != "pfs:-" || !ev.Skipped[0].Ranks[0].Copies[0].Corrupt {
		t.Fatalf("steps the recovery passed over: %v, want step 5 for rank 0's pfs:- copy", ev.Skipped)
	}
	tc.checkRestoredAt(job, 4, map[uint32]int{0: 2, 1: 1})
}

// TestRecoveryFallsBackTwoStepsOntoFullSlots: node-0 dies; rank 0's
// only other copies of steps 6 and 5 (the shared filesystem's) are
// corrupt, so the recovery falls back twice, to step 4. Rank 1 was in
// the middle of saving step 7 (prepared, not committed): its node's two
// slots hold step 6, its latest, and the save in progress, and steps 5
// and 4 only on its tiers, so restoring either needs a slot that only
// the steps after it hold. The abort follows the restore back (each
// fallback discards the steps after the older step on every node), so
// the slot is free and step 4 restores (the chaos suite's
// all-copies-corrupt found the restore refused "all slots hold").
func TestRecoveryFallsBackTwoStepsOntoFullSlots(t *testing.T) {
	const job = "recover18b"
	const segment = 8192 // a shard of rankData's size
	tc := fileTierCluster(t, 3, fallbackPolicy, func(node int, cfg *agent.Config) {
		if node == 1 {
			cfg.BudgetBytes = 2 * segment // two slots, no room for an extra one
		}
	})
	tc.saveOnTiers(job, 0, 6)
	if _, err := tc.clients[1].API().Prepare(ctxT(t), &agentpb.PrepareRequest{Job: job, Rank: 1, WorldSize: 2, Step: 7,
		SizeBytes: segment}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []int64{5, 6} {
		testcluster.Flip(t, filepath.Join(tc.pfs, filepath.FromSlash(tiers.ShardName(job, step, 0))), -100)
	}
	events := tc.watch(job)
	tc.agents[0].Stop()
	if _, err := tc.api.NodeDown(ctxT(t), &coordpb.NodeDownRequest{Node: "node-0", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events)
	if !ev.Ok || ev.Step != 4 {
		t.Fatalf("recovery event: %v, want a re-gang at step 4", ev)
	}
	var skipped []int64
	for _, u := range ev.Skipped {
		skipped = append(skipped, u.Step)
	}
	if !slices.Equal(skipped, []int64{6, 5}) {
		t.Fatalf("steps the recovery passed over: %v, want 6 and 5", skipped)
	}
	tc.checkRestoredAt(job, 4, map[uint32]int{0: 2, 1: 1})
}
