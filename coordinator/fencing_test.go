package coordinator_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/membership"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// saveAs saves step of rank through an open session (the same process
// across saves, unlike cluster.saveStep).
func saveAs(t *testing.T, s *sdk.Session, step int64, rank uint32) error {
	return s.Save(ctxT(t), step, []sdk.Tensor{{Name: "w", DType: shm.U8, Shape: []int64{4096}, Data: rankData(step, rank)}}, nil)
}

// TestPartitionHealFencesTheCutOffRank: three agents and a coordinator
// run failure detection; the node running rank 1 is cut off from every
// other member's gossip (its TCP links stay up: the harshest partition,
// where the cut-off side can still talk to the coordinator). It is
// declared dead, and the job recovered with rank 1 on the spare, at a new
// epoch. The old rank 1 process, still alive on the cut-off node, goes on
// saving: its saves must be refused (the gang-broken error naming the
// epochs) and never recorded, neither while cut off nor after the
// partition heals; the job's placement and steps stay the new gang's.
func TestPartitionHealFencesTheCutOffRank(t *testing.T) {
	const job, ws = "fence", 2
	faults := membership.NewFaultNetwork()
	reg := prometheus.NewRegistry()
	cl, seed := gossipCoordinator(t, faults, func(cfg *coordinator.Config) { cfg.Gossip.Registry = reg })
	for i := range 3 {
		cl.addAgent(func(cfg *agent.Config) {
			g := testcluster.GossipConfig(faults)
			cfg.Node, cfg.FailureDomain = fmt.Sprintf("node-%d", i), fmt.Sprintf("rack-%d", i)
			cfg.Gossip, cfg.GossipJoin = &g, []string{seed}
		})
	}
	wait.For(t, 10*time.Second, "the coordinator to see every agent alive", func() bool { return members(t, reg, "alive") == 4 })
	old := make([]*sdk.Session, ws) // rank r runs on node-r
	for r := range uint32(ws) {
		s, err := cl.clients[r].Session(job, r, ws)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		old[r] = s
	}
	for step := int64(1); step <= 3; step++ {
		for r, s := range old {
			if err := saveAs(t, s, step, uint32(r)); err != nil {
				t.Fatal(err)
			}
		}
		cl.waitLatest(job, step)
	}
	waitReplicas(t, cl, job, 3, ws, 2)
	events := cl.watch(job)
	for _, n := range []string{"coordinator", "node-0", "node-2"} {
		faults.Cut(n, "node-1")
	}
	ev := nextEvent(t, events)
	if !ev.Ok || ev.Step != 3 || ev.Placement[1] != "node-2" || ev.Epoch != 2 {
		t.Fatalf("recovery of the cut-off node: %v", ev)
	}

	// The old rank 1 saves on, on the cut-off node. Its first save after
	// the recovery may commit there, but the coordinator refuses to
	// record it, and its answer tells the agent the job's epoch: from
	// then on the old rank is refused.
	step, fenced := int64(4), error(nil)
	wait.For(t, 15*time.Second, "the cut-off rank's saves to be refused", func() bool {
		err := saveAs(t, old[1], step, 1)
		step++
		if err != nil {
			fenced = err
		}
		return err != nil
	})
	if !errors.Is(fenced, sdk.ErrGangBroken) || !strings.Contains(fenced.Error(), "belongs to epoch 1; the job is at epoch 2") {
		t.Fatalf("the cut-off rank's save: %v, want the gang-broken error naming its epoch and the job's", fenced)
	}

	// The new gang restores step 3 and trains on.
	newGang := []*sdk.Session{}
	for r, c := range []*sdk.Client{cl.clients[0], cl.clients[2]} {
		s, err := c.Session(job, uint32(r), ws)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.RestoreStep(ctxT(t), 3); err != nil {
			t.Fatalf("rank %d restoring step 3: %v", r, err)
		}
		newGang = append(newGang, s)
	}
	train := func(from, to int64) {
		for st := from; st <= to; st++ {
			for r, s := range newGang {
				if err := saveAs(t, s, st, uint32(r)); err != nil {
					t.Fatalf("the new gang's rank %d saving step %d: %v", r, st, err)
				}
			}
			cl.waitLatest(job, st)
		}
	}
	train(4, 6)

	faults.Heal()
	wait.For(t, 20*time.Second, "every member alive after the partition healed", func() bool { return members(t, reg, "alive") == 4 })
	if err := saveAs(t, old[1], 7, 1); !errors.Is(err, sdk.ErrGangBroken) {
		t.Fatalf("the old rank 1 saving after the partition healed: %v, want the gang-broken error", err)
	}
	train(7, 8)

	jobs, err := cl.api.ListJobs(ctxT(t), &coordpb.ListJobsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs.Jobs {
		if j.Id == job && (j.Placement[1] != "node-2" || j.Epoch != 2 || j.LatestConsistent != 8) {
			t.Fatalf("job after the partition healed: %v, want rank 1 on node-2, epoch 2, latest 8", j)
		}
	}
	steps, err := cl.api.ListSteps(ctxT(t), &coordpb.ListStepsRequest{Job: job})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range steps.Steps {
		if st.Step <= 3 {
			continue
		}
		resp, err := cl.api.InspectStep(ctxT(t), &coordpb.InspectStepRequest{Job: job, Step: st.Step})
		if status.Code(err) == codes.NotFound {
			continue // rotated out since the listing: nothing left to hold a shard of the wrong epoch
		}
		if err != nil {
			t.Fatal(err)
		}
		if resp.Step.Epoch != 2 {
			t.Errorf("step %d holds shards of epoch %d, want 2", st.Step, resp.Step.Epoch)
		}
		for _, c := range resp.Step.Copies {
			if c.Rank == 1 && c.Node == "node-1" && c.Tier == "shm" {
				t.Errorf("step %d: a copy of rank 1 on the fenced node-1 is recorded: %v", st.Step, c)
			}
		}
	}
}
