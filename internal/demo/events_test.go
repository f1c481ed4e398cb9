package demo

import (
	"errors"
	"testing"
	"time"
)

func TestParseEvent(t *testing.T) {
	const d = "0123456789abcdef"
	type testcase struct {
		line string
		want Event
		bad  bool
	}
	tests := map[string]testcase{
		"fresh": {line: formatFresh(0, d), want: Event{Kind: KindFresh, Digest: d}},
		"resumed": {line: formatResumed(12, d, 40100*time.Microsecond),
			want: Event{Kind: KindResumed, Step: 12, Digest: d, Restore: 40100 * time.Microsecond}},
		"saved warm": {line: formatSaved(13, 100200*time.Microsecond, 64<<20, 9100*time.Microsecond, false, d),
			want: Event{Kind: KindSaved, Step: 13, Digest: d, Compute: 100200 * time.Microsecond, Save: 9100 * time.Microsecond, Bytes: 64 << 20}},
		"saved cold": {line: formatSaved(1, 100*time.Millisecond, 4<<20, 35*time.Millisecond, true, d),
			want: Event{Kind: KindSaved, Step: 1, Digest: d, Compute: 100 * time.Millisecond, Save: 35 * time.Millisecond, Bytes: 4 << 20, Cold: true}},
		"save failed": {line: formatSaveFailed(14, errors.New("rewind: save step 14: agent\nunavailable")),
			want: Event{Kind: KindSaveFailed, Step: 14, Err: "rewind: save step 14: agent unavailable"}},
		"done":           {line: formatDone(30, d), want: Event{Kind: KindDone, Step: 30, Digest: d}},
		"empty":          {line: "", bad: true},
		"unknown kind":   {line: "started step 1 digest " + d, bad: true},
		"no digest":      {line: "done step 30", bad: true},
		"short digest":   {line: "done step 30 digest 12ab", bad: true},
		"step not a num": {line: "step x compute 1.0 ms saved 1.0 MiB in 1.0 ms digest " + d, bad: true},
		"no unit":        {line: "step 2 compute 1.0 saved 1.0 MiB in 1.0 ms digest " + d, bad: true},
		"no size":        {line: "step 2 compute 1.0 ms in 1.0 ms digest " + d, bad: true},
		"trailing junk":  {line: formatDone(3, d) + " extra", bad: true},
	}
	run := func(t *testing.T, tc testcase) {
		got, err := ParseEvent(tc.line)
		if tc.bad {
			if err == nil {
				t.Fatalf("ParseEvent(%q) = %+v, want an error", tc.line, got)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		tc.want.Line = tc.line
		if got != tc.want {
			t.Fatalf("ParseEvent(%q)\n got %+v\nwant %+v", tc.line, got, tc.want)
		}
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}
