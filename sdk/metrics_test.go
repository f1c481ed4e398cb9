package sdk_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/promtest"
)

// TestSaveSecondsAndNodeMetrics prepares a save, lets the fake clock run
// 250 ms while the rank writes, commits, and reads the agent's save
// histogram (the in-step time, by job), its segments by state and its
// identity.
func TestSaveSecondsAndNodeMetrics(t *testing.T) {
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	reg := prometheus.NewRegistry()
	c, _ := start(t, func(cfg *agent.Config) { cfg.Clock, cfg.Registry, cfg.FailureDomain = fake, reg, "rack-a" })
	ctx := ctxT(t)
	_, size := writeShard(t, "", "blk", 1)
	prep, err := c.API().Prepare(ctx, &agentpb.PrepareRequest{Job: "blk", Rank: 0, WorldSize: 1, Step: 1, SizeBytes: uint64(size)})
	if err != nil {
		t.Fatal(err)
	}
	fake.Step(250 * time.Millisecond)
	sum, _ := writeShard(t, prep.Path, "blk", 1)
	if _, err := c.API().Commit(ctx, &agentpb.CommitRequest{Job: "blk", Rank: 0, Slot: prep.Slot, Token: prep.Token, Step: 1, HeaderChecksum: sum}); err != nil {
		t.Fatal(err)
	}
	got := promtest.Samples(t, reg)
	for k, v := range map[string]float64{
		`rewind_agent_save_seconds_count{job_id="blk"}`:               1,
		`rewind_agent_save_seconds_sum{job_id="blk"}`:                 0.25,
		`rewind_agent_info{failure_domain="rack-a",node="test-node"}`: 1,
		`rewind_agent_segments{state="committed"}`:                    1,
		`rewind_agent_segments{state="writing"}`:                      0,
		`rewind_agent_segments{state="corrupt"}`:                      0,
	} {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}
