package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

// TestRecoveryPoints: a job at step 12, step 11 in two nodes' memory,
// NVMe durable at 10 and copying 12, the shared filesystem durable at 0,
// the object store (in its policy) holding nothing yet.
func TestRecoveryPoints(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	step := func(n int64, tiers ...*coordpb.TierCopy) *coordpb.Step {
		return &coordpb.Step{Step: n, ConsistentUnixNano: t0.Add(time.Duration(n) * 10 * time.Second).UnixNano(), Tiers: tiers}
	}
	durable := func(tier string) *coordpb.TierCopy {
		return &coordpb.TierCopy{Tier: tier, State: coordpb.TierCopyState_TIER_COPY_STATE_DURABLE}
	}
	steps := []*coordpb.Step{
		step(0, durable("pfs")),
		step(10, durable("nvme")),
		step(11),
		step(12, &coordpb.TierCopy{Tier: "nvme", State: coordpb.TierCopyState_TIER_COPY_STATE_COPYING}),
	}
	job := &coordpb.Job{Id: "j", LatestConsistent: 12, Protected: 11, Policy: "nvme:every=1,keep=2;s3:every=30m,keep=3"}
	var out bytes.Buffer
	if err := printRecoveryPoints(&out, recoveryPoints(job, steps), t0.Add(125*time.Second)); err != nil {
		t.Fatal(err)
	}
	want := `RECOVERY POINT       STEP  AGE
consistent           12    5s
memory of two nodes  11    15s
nvme                 10    25s
s3                   -     none
pfs                  0     2m5s
`
	if got := out.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	none := &coordpb.Job{Id: "new", LatestConsistent: -1, Protected: -1}
	out.Reset()
	if err := printRecoveryPoints(&out, recoveryPoints(none, nil), t0); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "consistent           -     none") {
		t.Errorf("a job with no step:\n%s", out.String())
	}
}

// TestTierProgress: two ranks of 100 bytes; NVMe durable, the object
// store half way, the shared filesystem failed.
func TestTierProgress(t *testing.T) {
	st := &coordpb.Step{
		Copies: []*coordpb.Copy{{Rank: 0, SizeBytes: 100}, {Rank: 0, SizeBytes: 100}, {Rank: 1, SizeBytes: 100}},
		Tiers: []*coordpb.TierCopy{
			{Tier: "nvme", State: coordpb.TierCopyState_TIER_COPY_STATE_DURABLE, BytesDone: 200},
			{Tier: "s3", State: coordpb.TierCopyState_TIER_COPY_STATE_COPYING, BytesDone: 100},
			{Tier: "pfs", State: coordpb.TierCopyState_TIER_COPY_STATE_FAILED, BytesDone: 50},
		},
	}
	if done, total, copying := tierProgress(st); done != 300 || total != 600 || copying != 1 {
		t.Errorf("progress %d/%d bytes, %d copying; want 300/600, 1", done, total, copying)
	}
}
