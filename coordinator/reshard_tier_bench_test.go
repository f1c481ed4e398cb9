package coordinator_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/miniotest"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/tiers"
)

// BenchmarkReshardFromATier compares two restores on a node that lost its
// memory, of a 64 MiB tensor that 4 ranks saved (row pieces of 16 MiB)
// and a real MinIO holds, the only copy left: at world size 4 (each
// rank's shard pulled whole from the store, verified) and at 3
// (RestoreInto: each new rank's agent reads the shards' headers and leaf
// hashes, then only the 1 MiB leaves its rows touch, in ranged GETs).
// The node's memory is emptied between ops; bytes per op are the whole
// tensor's.
//
//	go test -run '^$' -bench ReshardFromATier -benchtime 5x -count 5 ./coordinator
func BenchmarkReshardFromATier(b *testing.B) {
	st, err := s3StoreOn(miniotest.Start(b), nil)
	if err != nil {
		b.Fatal(err)
	}
	policy, err := tiers.ParsePolicy("s3:every=1,keep=2")
	if err != nil {
		b.Fatal(err)
	}
	ccfg := testcluster.CoordinatorConfig(b)
	ccfg.Replicas, ccfg.Policy = 0, policy
	coord := testcluster.StartCoordinator(b, ccfg)
	api := testcluster.DialCoordinator(b, coord.Addr)
	start := func() (*testcluster.Agent, *sdk.Client) {
		cfg := testcluster.AgentConfig(b)
		cfg.Node, cfg.CoordinatorAddr, cfg.Stores = "node-0", coord.Addr, map[tiers.Name]tiers.Store{"s3": st}
		cfg.ListenAddr = testcluster.FreeAddr(b)
		cfg.AdvertiseAddr, cfg.Logger = cfg.ListenAddr, testcluster.Discard()
		return testcluster.StartAgent(b, cfg), testcluster.Dial(b, cfg.Socket)
	}
	a, c := start()
	const rows, width = 64, 1 << 20
	saveBench(b, c, rows, width)
	wait.ForNil(b, time.Minute, "step 1 durable on s3", func() error {
		resp, err := api.ListSteps(b.Context(), &coordpb.ListStepsRequest{Job: "bench"})
		if err != nil {
			return err
		}
		for _, s := range resp.Steps {
			if s.Step == 1 && slices.ContainsFunc(s.Tiers, func(t *coordpb.TierCopy) bool {
				return t.Tier == "s3" && t.State == coordpb.TierCopyState_TIER_COPY_STATE_DURABLE
			}) {
				return nil
			}
		}
		return fmt.Errorf("steps %v", resp.Steps)
	})
	a.Stop() // the node and its memory are gone; it comes back empty
	_, c = start()
	wait.ForNil(b, 10*time.Second, "a plan with the object store as the only source", func() error {
		plan, err := api.PlanRestore(b.Context(), &coordpb.PlanRestoreRequest{Job: "bench", Step: 1, DryRun: true})
		if err != nil {
			return err
		}
		for _, r := range plan.Ranks {
			if len(r.Sources) != 1 || r.Sources[0].Tier != "s3" {
				return fmt.Errorf("rank %d: sources %v", r.Rank, r.Sources)
			}
		}
		return nil
	})
	benchRestores(b, c, rows, width)
}
