package goodput

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/internal/demo"
)

// at is a time s seconds after the epoch of the synthetic records.
func at(s float64) time.Time {
	return time.Unix(1_000_000, 0).Add(time.Duration(s * float64(time.Second)))
}

func sec(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// steps returns saved events of steps from..to, the k-th at start+k
// seconds, each with 0.9 s of compute and 0.05 s of save.
func steps(from, to int64, start float64) []demo.Event {
	var out []demo.Event
	for s := from; s <= to; s++ {
		out = append(out, demo.Event{Kind: demo.KindSaved, Step: s, At: at(start + float64(s-from+1)), Compute: sec(0.9), Save: sec(0.05)})
	}
	return out
}

type accountCase struct {
	rec  *Record
	want map[Term]time.Duration
	wall time.Duration
	kept float64
}

func TestAccount(t *testing.T) {
	fresh := demo.Event{Kind: demo.KindFresh, At: at(0.1)}
	cases := map[string]accountCase{
		"no fault": {
			rec: &Record{Start: at(0), End: at(20), StepTime: sec(0.9), Procs: []*RankProc{
				{Rank: 0, Started: at(0), Events: append([]demo.Event{fresh}, steps(1, 10, 0.1)...)},
			}},
			want: map[Term]time.Duration{TermRestart: sec(0.1), TermCompute: sec(9), TermCheckpoint: sec(0.5), TermSync: sec(0.5)},
			wall: sec(10.1), kept: 10,
		},
		"a node lost after step 5, resumed from it": {
			rec: &Record{Start: at(0), End: at(20), StepTime: sec(0.9),
				Procs: []*RankProc{
					// steps 1..6 at 1.1..6.1; the fault at 5.6 cuts step 6 short
					{Rank: 0, Started: at(0), Events: append([]demo.Event{fresh}, steps(1, 6, 0.1)...)},
					{Rank: 0, Started: at(7.3), Events: append([]demo.Event{{Kind: demo.KindResumed, Step: 5, At: at(7.5), Restore: sec(0.1)}}, steps(6, 8, 7.5)...)},
				},
				Faults:     []*Fault{{Kind: FaultNodeKill, At: at(5.6)}},
				Recoveries: []*Recovery{{Step: 5, Fault: 0, Detected: at(6.9), Planned: at(6.9), Restored: at(7.0)}},
			},
			// lost: step 6's first 0.5 s; detection 5.6-6.9; restore 6.9-7.0
			// and the rank's 0.1 s; restart 7.0-7.3, then 7.3-7.4.
			want: map[Term]time.Duration{TermRestart: sec(0.1 + 0.3 + 0.1), TermCompute: sec(8 * 0.9), TermCheckpoint: sec(8 * 0.05),
				TermSync: sec(8 * 0.05), TermLost: sec(0.5), TermDetection: sec(1.3), TermRestore: sec(0.2)},
			wall: sec(10.5), kept: 8,
		},
		"a node cut off: the job commits until detection, and keeps it": {
			rec: &Record{Start: at(0), End: at(20), StepTime: sec(0.9),
				Procs: []*RankProc{
					// steps 1..7 at 1.1..7.1; the fault at 5.6; step 6 is consistent when detected
					{Rank: 0, Started: at(0), Events: append([]demo.Event{fresh}, steps(1, 7, 0.1)...)},
					{Rank: 0, Started: at(7.3), Events: append([]demo.Event{{Kind: demo.KindResumed, Step: 6, At: at(7.5), Restore: sec(0.1)}}, steps(7, 8, 7.5)...)},
				},
				Faults:     []*Fault{{Kind: FaultPartition, At: at(5.6)}},
				Recoveries: []*Recovery{{Step: 6, Fault: 0, Detected: at(6.9), Planned: at(6.9), Restored: at(7.0)}},
			},
			// step 6 (5.1-6.1) stays useful; detection is the rest of
			// 5.6-6.9; step 7 of the old gang lies inside the windows.
			want: map[Term]time.Duration{TermRestart: sec(0.1 + 0.3 + 0.1), TermCompute: sec(8 * 0.9), TermCheckpoint: sec(8 * 0.05),
				TermSync: sec(8 * 0.05), TermDetection: sec(0.8), TermRestore: sec(0.2)},
			wall: sec(9.5), kept: 8,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) { runAccount(t, tc) })
	}
}

func runAccount(t *testing.T, tc accountCase) {
	b := Account(tc.rec)
	if d := b.Wall - tc.wall; d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("wall %v, want %v", b.Wall, tc.wall)
	}
	var sum time.Duration
	for term := range numTerms {
		sum += b.Terms[term]
		if d := b.Terms[term] - tc.want[term]; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("%s: %v, want %v", term, b.Terms[term], tc.want[term])
		}
	}
	if sum != b.Wall {
		t.Errorf("terms add up to %v, wall is %v", sum, b.Wall)
	}
	if b.Steps != tc.kept {
		t.Errorf("%v steps kept, want %v", b.Steps, tc.kept)
	}
}

// TestProject checks the extrapolation's formula on round figures.
func TestProject(t *testing.T) {
	b := Breakdown{Steps: 100, Recoveries: 2, Faulted: 2}
	b.Terms[TermCompute], b.Terms[TermCheckpoint], b.Terms[TermSync] = sec(90), sec(1), sec(9) // a 1 s step period
	b.Terms[TermLost], b.Terms[TermDetection], b.Terms[TermRestore], b.Terms[TermRestart] = sec(2), sec(2), sec(1), sec(1)
	p := Project(b, Scenario{Nodes: 1, FailureEvery: 1000 * time.Second, StepTime: sec(9.99)})
	// C 10 ms: T+C = 10 s; per failure 1 + 0.5 + 0.5 + 1 step of 10 s = 12 s.
	want := 9.99 / 10 * (1 - 12.0/1000)
	if !p.OK || p.PerFailure != sec(12) || p.Goodput < want-1e-9 || p.Goodput > want+1e-9 {
		t.Fatalf("projection %+v, want 12 s per failure and goodput %v", p, want)
	}
}

// TestReplay: records written as JSON (--record) give the same accounting
// when read back (--from-record).
func TestReplay(t *testing.T) {
	rec := &Record{Mode: modeRewind, Start: at(0), End: at(20), StepTime: sec(0.9), Procs: []*RankProc{
		{Rank: 0, Started: at(0), Events: append([]demo.Event{{Kind: demo.KindFresh, At: at(0.1)}}, steps(1, 10, 0.1)...)},
	}}
	b, err := json.Marshal([]*Record{rec})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "records.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cfg := DefaultConfig()
	cfg.Out = &out
	res, err := Replay(cfg, path)
	if err != nil {
		t.Fatal(err)
	}
	if want := Account(rec); len(res.Terms) != 1 || res.Terms[0] != want {
		t.Fatalf("replayed %+v, want %+v", res.Terms, want)
	}
	if !strings.Contains(out.String(), "89.11%") { // 9 s of compute in 10.1 s
		t.Fatalf("no goodput of 89.11%% in:\n%s", out.String())
	}
}

// TestConfigsAreValid: what `make goodput` runs, with and without
// --quick, passes Validate (a --quick that Run refuses is no smoke test).
func TestConfigsAreValid(t *testing.T) {
	for name, c := range map[string]Config{"default": DefaultConfig(), "quick": QuickConfig()} {
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
