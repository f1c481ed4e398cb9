package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/internal/promtest"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
)

// BenchmarkLockstepSave: four ranks on two nodes save a small state in
// lockstep, as synchronous training does, with a coordinator deciding
// each step and one replica of every shard; one op is one step (every
// rank's Save), and gap is the training step between two saves (0: back
// to back, the worst case). It reports the p50 and p99 of one rank's
// Save: the slot choice (Prepare), the copy and the commit, and any wait
// for the coordinator to move the job's pins (agent pickSlot), which a
// step newer than the consistent one, held back, adds when the agent's
// answers lag the saves; and how many saves in 100 asked the coordinator
// (rewind_agent_pin_refreshes_total).
//
//	go test -run '^$' -bench LockstepSave -benchtime 500x ./coordinator
func BenchmarkLockstepSave(b *testing.B) {
	for _, slots := range []int{2, 3} {
		for _, gap := range []time.Duration{0, 20 * time.Millisecond} {
			b.Run(fmt.Sprintf("slots=%d/gap=%v", slots, gap), func(b *testing.B) { benchLockstep(b, slots, gap) })
		}
	}
}

func benchLockstep(b *testing.B, slots int, gap time.Duration) {
	const nodes, ranks = 2, 4
	ccfg := testcluster.CoordinatorConfig(b)
	ccfg.Replicas = 1
	coord := testcluster.StartCoordinator(b, ccfg)
	sessions := make([]*sdk.Session, ranks)
	regs := make([]*prometheus.Registry, nodes)
	for n := range nodes {
		cfg := testcluster.AgentConfig(b)
		regs[n] = prometheus.NewRegistry()
		cfg.Registry = regs[n]
		cfg.Node, cfg.CoordinatorAddr, cfg.SlotsPerRank = fmt.Sprintf("node-%d", n), coord.Addr, slots
		cfg.ListenAddr = testcluster.FreeAddr(b)
		cfg.AdvertiseAddr, cfg.Logger = cfg.ListenAddr, testcluster.Discard()
		testcluster.StartAgent(b, cfg)
		c := testcluster.Dial(b, cfg.Socket)
		for r := n; r < ranks; r += nodes {
			var err error
			if sessions[r], err = c.Session("bench", uint32(r), ranks); err != nil {
				b.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var mu sync.Mutex
	lat := make([]time.Duration, 0, ranks*b.N)
	refreshes := func() float64 {
		sum := 0.0
		for _, reg := range regs {
			sum += promtest.Samples(b, reg)["rewind_agent_pin_refreshes_total"]
		}
		return sum
	}
	before := refreshes()
	b.ResetTimer()
	for step := range int64(b.N) {
		if gap > 0 {
			time.Sleep(gap) // the training step: no save runs
		}
		var wg sync.WaitGroup
		for r, s := range sessions {
			wg.Go(func() {
				start := time.Now()
				if err := s.Save(ctx, step, tinyState(r, step), nil); err != nil {
					b.Error(err)
				}
				d := time.Since(start)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(100*(refreshes()-before)/float64(len(lat)), "asked/100saves")
}
