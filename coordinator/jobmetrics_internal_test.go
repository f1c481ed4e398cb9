package coordinator

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/promtest"
)

// TestJobMetrics steps a fake clock through saves, replicas, a tier copy
// and a re-gang, and checks each per-job gauge against the times the
// test chose.
func TestJobMetrics(t *testing.T) {
	t0 := time.Unix(10_000, 0)
	clk := clock.NewFake(t0)
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Clock, cfg.Logger, cfg.Registry = t.TempDir(), clk, discardLogger(), reg
	var follower atomic.Bool
	cfg.Leading = func() bool { return !follower.Load() }
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.apply(func(ch *Changes) error {
		_, err := c.state.RegisterJob("j", 2, nil, ch)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	save := func(step int64, node string) {
		t.Helper()
		for r := range uint32(2) {
			rec := Record{Job: "j", Step: step, Rank: r, WorldSize: 2, Node: node, Size: 1000 + uint64(r), Sum: fmt.Sprintf("s%d-%d", step, r), State: CopyCommitted}
			if _, err := c.report(node, []Record{rec}); err != nil {
				t.Fatal(err)
			}
		}
	}
	save(1, "a") // consistent at t0
	save(1, "b") // in two nodes' memory
	clk.Step(10 * time.Second)
	save(2, "a") // consistent at t0+10s
	c.tiers.mu.Lock()
	c.tiers.copies[tierKey{"j", 1, "nvme"}] = &tierCopy{Job: "j", Step: 1, Tier: "nvme", State: tcDurable}
	c.tiers.mu.Unlock()
	clk.Step(5 * time.Second)

	got := promtest.Samples(t, reg)
	want := map[string]float64{
		`rewind_coordinator_leader`:                                     1,
		`rewind_job_latest_step{job_id="j"}`:                            2,
		`rewind_job_epoch{job_id="j"}`:                                  1,
		`rewind_job_world_size{job_id="j"}`:                             2,
		`rewind_job_recoveries_total{job_id="j",result="ok"}`:           0,
		`rewind_job_consistent_age_seconds{job_id="j"}`:                 5,
		`rewind_job_protected_age_seconds{job_id="j"}`:                  15,
		`rewind_job_replication_lag_seconds{job_id="j"}`:                10,
		`rewind_job_recovery_point_age_seconds{job_id="j",tier="nvme"}`: 15,
		`rewind_job_tier_lag_seconds{job_id="j",tier="nvme"}`:           10,
		`rewind_job_step_bytes{job_id="j"}`:                             2001,
		`rewind_job_lost_seconds_total{job_id="j"}`:                     0,
	}
	check(t, got, want)

	// A node is declared dead at t0+15s; the restore of step 2 is planned
	// 1 s later and done 2 s after that; the new gang's first step (3)
	// is consistent 4 s after the restore. Without the failure step 3
	// would have come 10 s (the job's pace) after step 2: it came 12 s
	// after, so 2 s were lost.
	detected := clk.Now()
	c.jobs.reganged(&coordpb.JobEvent{Job: "j", Ok: true, Step: 2, Epoch: 2, DetectedUnixNano: detected.UnixNano(),
		PlannedUnixNano: detected.Add(time.Second).UnixNano(), RestoredUnixNano: detected.Add(3 * time.Second).UnixNano()})
	c.jobs.reganged(&coordpb.JobEvent{Job: "j", Ok: false})
	clk.Step(7 * time.Second)
	save(3, "a")
	got = promtest.Samples(t, reg)
	check(t, got, map[string]float64{
		`rewind_job_lost_seconds_total{job_id="j"}`:                           2,
		`rewind_job_recoveries_total{job_id="j",result="ok"}`:                 1,
		`rewind_job_recoveries_total{job_id="j",result="failed"}`:             1,
		`rewind_job_recovery_phase_seconds_sum{job_id="j",phase="plan"}`:      1,
		`rewind_job_recovery_phase_seconds_sum{job_id="j",phase="restore"}`:   2,
		`rewind_job_recovery_phase_seconds_sum{job_id="j",phase="restart"}`:   4,
		`rewind_job_recovery_phase_seconds_count{job_id="j",phase="restart"}`: 1,
		`rewind_job_consistent_age_seconds{job_id="j"}`:                       0,
		`rewind_job_latest_step{job_id="j"}`:                                  3,
	})
	save(4, "a") // a later step ends no restart again
	if n := promtest.Samples(t, reg)[`rewind_job_recovery_phase_seconds_count{job_id="j",phase="restart"}`]; n != 1 {
		t.Errorf("restart observed %v times, want 1", n)
	}

	// A follower's index is not the cluster's: it reports no job.
	follower.Store(true)
	got = promtest.Samples(t, reg)
	if got[`rewind_coordinator_leader`] != 0 {
		t.Errorf("follower: leader gauge %v, want 0", got[`rewind_coordinator_leader`])
	}
	for k := range got {
		if strings.HasPrefix(k, "rewind_job_") && !strings.HasPrefix(k, "rewind_job_recover") {
			t.Errorf("follower reports %s", k)
		}
	}
}

func check(t *testing.T, got, want map[string]float64) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if v, ok := got[k]; !ok {
			t.Errorf("%s missing", k)
		} else if v != want[k] {
			t.Errorf("%s = %v, want %v", k, v, want[k])
		}
	}
}
