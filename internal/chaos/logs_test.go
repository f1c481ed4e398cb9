package chaos

import (
	"testing"
	"time"

	"rewind.dev/rewind/internal/demo"
)

func TestParseLogs(t *testing.T) {
	out := []byte(`2026-11-21T09:20:00.100000000Z [node] node node2, job chaos: starting ranks [1] (placement known: false)
2026-11-21T09:20:00.200000000Z [rank 1] fresh step 0 digest 8afa63bac9aaf811
2026-11-21T09:20:00.500000000Z [rank 1] step 1 compute 250.7 ms saved 4.0 MiB in 20.7 ms cold digest ccdf0b7151a76797
2026-11-21T09:20:00.600000000Z [rank 1 stderr] rewind demo-train: demo: rank 1 waited a minute
2026-11-21T09:20:00.700000000Z [rank 12] resumed step 7 digest 3f2a00000000aaaa restore 40.1 ms
2026-11-21T09:20:00.800000000Z [rank 1] step 2 save failed: rewind: slot not available
no timestamp here
2026-11-21T09:20:00.900000000Z time=... level=INFO msg="an agent line on stdout is not ours"
2026-11-21T09:20:01.000000000Z [rank x] step 3 compute 1.0 ms saved 4.0 MiB in 1.0 ms digest ccdf0b7151a76797
`)
	lines := ParseLogs("node2", out)
	type want struct {
		rank int
		kind demo.Kind
		step int64
	}
	wants := []want{{-1, "", 0}, {1, demo.KindFresh, 0}, {1, demo.KindSaved, 1}, {1, "", 0}, {12, demo.KindResumed, 7}, {1, demo.KindSaveFailed, 2}}
	if len(lines) != len(wants) {
		for _, l := range lines {
			t.Logf("%+v", l)
		}
		t.Fatalf("parsed %d lines, want %d", len(lines), len(wants))
	}
	for i, w := range wants {
		l := lines[i]
		if l.Service != "node2" || l.Rank != w.rank {
			t.Errorf("line %d: service %s rank %d, want node2 rank %d", i, l.Service, l.Rank, w.rank)
		}
		if w.kind == "" {
			if l.Event != nil {
				t.Errorf("line %d: %q parsed as an event", i, l.Text)
			}
			continue
		}
		if l.Event == nil || l.Event.Kind != w.kind || l.Event.Step != w.step {
			t.Errorf("line %d: event %+v, want %s step %d", i, l.Event, w.kind, w.step)
		}
	}
	if at := lines[1].At; !at.Equal(time.Date(2026, 11, 21, 9, 20, 0, 200_000_000, time.UTC)) || !lines[1].Event.At.Equal(at) {
		t.Errorf("timestamp %v, event at %v", at, lines[1].Event.At)
	}
	if got := lines[2].Event.Digest; got != "ccdf0b7151a76797" {
		t.Errorf("digest %q", got)
	}
}

func TestEventsMergedInTimeOrder(t *testing.T) {
	a := ParseLogs("node1", []byte("2026-11-21T09:20:02Z [rank 0] step 2 compute 1.0 ms saved 4.0 MiB in 1.0 ms digest 0000000000000002\n"))
	b := ParseLogs("node2", []byte("2026-11-21T09:20:01Z [rank 1] step 1 compute 1.0 ms saved 4.0 MiB in 1.0 ms digest 0000000000000001\n"+
		"2026-11-21T09:20:01Z [node] started rank 1\n"))
	evs := events(append(a, b...))
	if len(evs) != 2 || evs[0].Service != "node2" || evs[1].Service != "node1" {
		t.Fatalf("events not merged by time: %+v", evs)
	}
}

func TestLinesSince(t *testing.T) {
	out := []byte("2026-11-21T09:00:01Z time=x msg=\"restore source failed\" a=1\n" +
		"2026-11-21T09:00:03Z time=y msg=\"restore source failed\" a=2\n" +
		"2026-11-21T09:00:04Z time=z msg=\"other\"\n" +
		"not stamped restore source failed\n")
	since := time.Date(2026, 11, 21, 9, 0, 2, 0, time.UTC)
	got := linesSince(out, since, "restore source failed")
	if len(got) != 1 || got[0] != `time=y msg="restore source failed" a=2` {
		t.Fatalf("lines since 09:00:02 naming a failed source: %q", got)
	}
}
