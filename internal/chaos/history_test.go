package chaos

import (
	"strings"
	"testing"
	"time"
)

type historyCase struct {
	ops  []Op
	want string // a part of the failure's detail; empty: must pass
}

// hist builds a job's ops one second apart, in the order given.
func hist(ops ...Op) []Op {
	t0 := time.Date(2026, 11, 25, 4, 0, 0, 0, time.UTC)
	for i := range ops {
		ops[i].At = t0.Add(time.Duration(i) * time.Second)
		if ops[i].Job == "" {
			ops[i].Job = "j"
		}
	}
	return ops
}

func latest(step int64) Op { return Op{Client: "latest poller", Kind: OpLatest, Step: step} }

// latestAt: a Latest answer of the job at epoch, which resumed from from.
func latestAt(step int64, epoch uint64, from int64) Op {
	return Op{Client: "latest poller", Kind: OpLatest, Step: step, Epoch: epoch, EpochStep: from}
}

func restoreOp(step, newest, named int64, skipped ...int64) Op {
	return Op{Client: "recovery", Kind: OpRestore, Step: step, Newest: newest, Named: named, Skipped: skipped}
}

// listing: restorable steps, and the steps durable on s3.
func listing(steps []int64, s3 ...int64) Op {
	return Op{Client: "lister", Kind: OpListing, Steps: steps, Durable: map[string][]int64{"s3": s3}}
}

func TestCheckHistory(t *testing.T) {
	keep := map[string]int{"s3": 2}
	cases := map[string]historyCase{
		"advancing": {ops: hist(latest(1), latest(2), latest(2), latest(5),
			Op{Client: "rank 0", Kind: OpSave, Step: 6}, latest(6))},
		"regression": {ops: hist(latest(4), latest(5), latest(4)),
			want: "went back: 4"},
		"regression in one job of two": {ops: hist(latest(4), Op{Job: "k", Kind: OpLatest, Step: 9}, latest(5), Op{Job: "k", Kind: OpLatest, Step: 8}),
			want: "job k: the latest consistent step went back: 8"},
		"operator restore to an older step": {ops: hist(latest(7), restoreOp(3, 7, 3), latest(3), latest(4))},
		"operator restore elsewhere than named": {ops: hist(latest(7), restoreOp(4, 7, 3)),
			want: "named step 3, the restore landed on 4"},
		"restore to the newest":       {ops: hist(latest(7), restoreOp(7, 7, -1), latest(8))},
		"restore past a skipped step": {ops: hist(latest(5), restoreOp(4, 5, -1, 5), latest(4), latest(5))},
		"restore to an older step than available": {ops: hist(latest(5), restoreOp(4, 5, -1)),
			want: "landed on step 4, though step 5 was restorable"},
		"restore to a step it skipped": {ops: hist(restoreOp(4, 5, -1, 5, 4)),
			want: "which it reported unrestorable"},
		"regression after a restore": {ops: hist(latest(5), restoreOp(4, 5, -1, 5), latest(6), latest(5)),
			want: "went back: 5"},
		"durable kept":                 {ops: hist(listing([]int64{3, 4}, 4), listing([]int64{4, 5}, 4), listing([]int64{4, 8}, 4, 8))},
		"durable retired by retention": {ops: hist(listing([]int64{4}, 4), listing([]int64{8, 12}, 8, 12))},
		"lost save": {ops: hist(listing([]int64{4, 8}, 4, 8), listing([]int64{4, 9}, 4)),
			want: "lost at 04:00:01.000, neither retired nor removed: steps 8 (durable on s3)"},
		"lost while retention keeps one newer": {ops: hist(listing([]int64{4, 8}, 4, 8), listing([]int64{8, 12}, 8)),
			want: "steps 4"},
		"removed by an operator": {ops: hist(listing([]int64{4, 8}, 4, 8), Op{Client: "operator", Kind: OpRemoved, Step: 8},
			listing([]int64{4}, 4))},
		"removed by a restore to an older step": {ops: hist(listing([]int64{4, 8}, 4, 8), restoreOp(4, -1, 4),
			listing([]int64{4, 5}, 4))},
		"skipped by a restore":         {ops: hist(listing([]int64{4, 8}, 4, 8), restoreOp(4, 8, -1, 8), listing([]int64{4}, 4))},
		"empty":                        {want: "no op was recorded"},
		"resumed at the restored step": {ops: hist(restoreOp(4, 4, -1), Op{Client: "rank 1", Kind: OpResumed, Step: 4})},
		"resumed elsewhere": {ops: hist(restoreOp(4, 4, -1), Op{Client: "rank 1", Kind: OpResumed, Step: 5}),
			want: "rank 1 resumed at step 5, the last restore (recovery) landed on 4"},
		"back across a re-gang its successor finished": {ops: hist(latestAt(25, 1, -1), latestAt(24, 2, 24),
			restoreOp(24, 24, -1, 25), latestAt(25, 3, 24))},
		"back across a re-gang no restore finished": {ops: hist(latestAt(25, 1, -1), latestAt(24, 2, 24), latestAt(24, 2, 24)),
			want: "went back to 24 at 04:00:01.000, across the re-gang of epoch 2, and no restore landed on it"},
		"back past the step the new epoch resumed from": {ops: hist(latestAt(25, 1, -1), latestAt(23, 2, 24), restoreOp(23, 23, -1)),
			want: "went back: 23"},
		"back within one epoch": {ops: hist(latestAt(25, 2, 10), latestAt(24, 2, 10)),
			want: "went back: 24"},
		"old answers while a restore runs": {ops: rewindWindow(latest(9), listing([]int64{4, 8}, 4, 8))},
		"old answers after a restore ended": {ops: afterWindow(latest(8), latest(4)),
			want: "went back: 4"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) { runHistory(t, tc, keep) })
	}
}

func runHistory(t *testing.T, tc historyCase, keep map[string]int) {
	t.Helper()
	c := CheckHistory(tc.ops, keep)
	if tc.want == "" {
		if !c.OK {
			t.Fatalf("failed: %s", c.Detail)
		}
		return
	}
	if c.OK {
		t.Fatalf("passed (%s), want a failure with %q", c.Detail, tc.want)
	}
	if !strings.Contains(c.Detail, tc.want) {
		t.Fatalf("detail %q, want it to contain %q", c.Detail, tc.want)
	}
}

// TestHistoryOrder: ops added out of order are judged in time order.
func TestHistoryOrder(t *testing.T) {
	ops := hist(latest(4), latest(5))
	var h History
	h.Add(ops[1])
	h.Add(ops[0])
	if c := CheckHistory(h.Ops(), nil); !c.OK {
		t.Fatalf("failed: %s", c.Detail)
	}
}

// rewindWindow: a restore to step 4 planned at 04:00:01 that ended at
// 04:00:05, with the given ops at 04:00:02 and later (each a second
// apart) inside it, then a listing at 04:00:06 without the later steps.
func rewindWindow(inside ...Op) []Op {
	t0 := time.Date(2026, 11, 25, 4, 0, 0, 0, time.UTC)
	ops := []Op{latest(8), listing([]int64{4, 8}, 4, 8), restoreOp(4, 8, -1, 8)}
	ops[0].At, ops[1].At, ops[2].At = t0, t0, t0.Add(time.Second)
	ops[2].Done = t0.Add(5 * time.Second)
	for i, op := range inside {
		op.At = t0.Add(time.Duration(2+i) * time.Second)
		ops = append(ops, op)
	}
	last := listing([]int64{4}, 4)
	last.At = t0.Add(6 * time.Second)
	ops = append(ops, last)
	for i := range ops {
		ops[i].Job = "j"
	}
	return ops
}

// afterWindow: rewindWindow, then ops from 04:00:07, a second apart.
func afterWindow(after ...Op) []Op {
	ops := rewindWindow()
	t := ops[len(ops)-1].At
	for i, op := range after {
		op.At, op.Job = t.Add(time.Duration(1+i)*time.Second), "j"
		ops = append(ops, op)
	}
	return ops
}
