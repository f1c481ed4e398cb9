package coordinator_test

import (
	"fmt"
	"testing"
	"time"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// BenchmarkReshardAcrossNodes compares two restores on node-1 of a
// 64 MiB tensor that 4 ranks saved on node-0 (row pieces of 16 MiB, no
// replicas, TLS between the agents as in production): at world size 4
// (each rank restores its own shard, which its agent pulls whole from
// node-0) and at 3 (RestoreInto: each new rank's agent fetches from node-0
// only the 1 MiB leaves its rows touch, into partial opens). Node-1's
// memory is emptied between ops; bytes per op are the whole tensor's.
//
//	go test -run '^$' -bench ReshardAcrossNodes -benchtime 5x -count 5 ./coordinator
func BenchmarkReshardAcrossNodes(b *testing.B) {
	ccfg := testcluster.CoordinatorConfig(b)
	ccfg.Replicas = 0
	coord := testcluster.StartCoordinator(b, ccfg)
	clients := make([]*sdk.Client, 2)
	for n := range clients {
		cfg := testcluster.AgentConfig(b)
		cfg.Node, cfg.CoordinatorAddr = fmt.Sprintf("node-%d", n), coord.Addr
		cfg.ListenAddr = testcluster.FreeAddr(b)
		cfg.AdvertiseAddr, cfg.Logger = cfg.ListenAddr, testcluster.Discard()
		testcluster.StartAgent(b, cfg)
		clients[n] = testcluster.Dial(b, cfg.Socket)
	}
	const rows, width = 64, 1 << 20
	saveBench(b, clients[0], rows, width)
	// Restored once node-0 has verified its shards, as a recovery after
	// a save finds them (the leaf hashes a ranged read checks against).
	wait.ForNil(b, time.Minute, "node-0's shards verified and step 1 consistent", func() error {
		shards, err := clients[0].List(b.Context(), "bench")
		if err != nil {
			return err
		}
		for _, sh := range shards {
			if !sh.Verified {
				return fmt.Errorf("rank %d not verified", sh.Rank)
			}
		}
		s, _ := clients[1].Session("bench", 0, 4)
		if step, ok, err := s.LatestConsistent(b.Context()); err != nil || !ok || step != 1 {
			return fmt.Errorf("latest consistent step %d %t %v", step, ok, err)
		}
		return nil
	})
	benchRestores(b, clients[1], rows, width)
}

// saveBench saves step 1 of job "bench" through c: a tensor of rows rows
// of width bytes, a quarter of the rows from each of 4 ranks.
func saveBench(b *testing.B, c *sdk.Client, rows, width int64) {
	global := make([]byte, rows*width)
	for i := range global {
		global[i] = byte(i*13 + i>>20)
	}
	testcluster.SaveRowPieces(b, c, "bench", 1, global, rows, width, 4)
}

// benchRestores runs the two restores of step 1 of job "bench" (64 rows
// of width bytes saved by 4 ranks) on c's node: at world size 4 and,
// resharding, at 3. The node's memory is emptied after each op, untimed.
func benchRestores(b *testing.B, c *sdk.Client, rows, width int64) {
	empty := func(b *testing.B) {
		b.StopTimer()
		if _, err := c.API().Delete(b.Context(), &agentpb.DeleteRequest{Job: "bench", AllRanks: true, Step: -1}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.Run("same-world-size-4", func(b *testing.B) {
		b.SetBytes(rows * width)
		for b.Loop() {
			for r := range uint32(4) {
				s, _ := c.Session("bench", r, 4)
				if _, err := s.RestoreStep(b.Context(), 1); err != nil {
					b.Fatal(err)
				}
			}
			empty(b)
		}
	})
	b.Run("reshard-to-3", func(b *testing.B) {
		b.SetBytes(rows * width)
		for b.Loop() {
			for j := range int64(3) {
				off, n := j*rows/3, (j+1)*rows/3-j*rows/3
				s, _ := c.Session("bench", uint32(j), 3)
				sl := sdk.Slice{Name: "w", DType: shm.U8, Offsets: []int64{off, 0}, Lengths: []int64{n, width}, Data: make([]byte, n*width)}
				res, err := s.RestoreStepInto(b.Context(), 1, sdk.Layout{Slices: []sdk.Slice{sl}})
				if err != nil {
					b.Fatal(err)
				}
				if res.Fetched == 0 {
					b.Fatal("nothing fetched: the shards were on the node already")
				}
			}
			empty(b)
		}
	})
}
