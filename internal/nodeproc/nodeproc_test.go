package nodeproc

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/api/coordpb"
)

func TestInitialRanks(t *testing.T) {
	type testcase struct {
		initial []uint32
		job     *coordpb.Job
		want    []uint32
	}
	run := func(t *testing.T, tc testcase) {
		if got := initialRanks("node2", tc.initial, tc.job); !slices.Equal(got, tc.want) {
			t.Fatalf("initialRanks = %v, want %v", got, tc.want)
		}
	}
	tests := map[string]testcase{
		"a new job":   {initial: []uint32{1}, want: []uint32{1}},
		"a new spare": {initial: nil, want: nil},
		// Another node's first rank registered the job before this one
		// asked: its own initial rank is placed nowhere yet.
		"the job known, this rank not yet": {initial: []uint32{1}, job: &coordpb.Job{Placement: map[uint32]string{0: "node1"}}, want: []uint32{1}},
		// A node restarted after a recovery moved its rank away.
		"its rank moved away": {initial: []uint32{1}, job: &coordpb.Job{Placement: map[uint32]string{0: "node1", 1: "node4"}}, want: nil},
		// A node restarted after a recovery moved ranks onto it.
		"ranks moved here": {initial: nil, job: &coordpb.Job{Placement: map[uint32]string{0: "node2", 1: "node1", 2: "node2"}}, want: []uint32{0, 2}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

func TestDecide(t *testing.T) {
	cfg := DefaultConfig()
	t0 := time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)
	type testcase struct {
		placement  map[uint32]string
		running    []uint32
		ranks      map[uint32]*rankInfo
		lastRegang time.Time
		now        time.Time
		kill       []uint32
		start      []uint32
	}
	run := func(t *testing.T, tc testcase) {
		if tc.ranks == nil {
			tc.ranks = map[uint32]*rankInfo{}
		}
		kill, start := decide("node1", tc.placement, tc.running, tc.ranks, tc.lastRegang, tc.now, cfg)
		if !slices.Equal(kill, tc.kill) || !slices.Equal(start, tc.start) {
			t.Fatalf("decide = kill %v start %v, want kill %v start %v", kill, start, tc.kill, tc.start)
		}
	}
	tests := map[string]testcase{
		"in place": {placement: map[uint32]string{0: "node1", 1: "node2"}, running: []uint32{0}, now: t0},
		// The first sighting of a rank placed elsewhere is a strike, the
		// second kills it.
		"moved away, first strike": {placement: map[uint32]string{0: "node3"}, running: []uint32{0},
			ranks: map[uint32]*rankInfo{0: {since: t0}}, now: t0},
		"moved away, second strike": {placement: map[uint32]string{0: "node3"}, running: []uint32{0},
			ranks: map[uint32]*rankInfo{0: {since: t0, strikes: 1}}, now: t0, kill: []uint32{0}},
		"not placed yet": {placement: map[uint32]string{}, running: []uint32{0},
			ranks: map[uint32]*rankInfo{0: {since: t0, strikes: 1}}, now: t0},
		"stopped a moment": {placement: map[uint32]string{0: "node1"},
			ranks: map[uint32]*rankInfo{0: {since: t0}}, now: t0.Add(cfg.RestartAfter - time.Second)},
		"stopped long": {placement: map[uint32]string{0: "node1"},
			ranks: map[uint32]*rankInfo{0: {since: t0}}, now: t0.Add(cfg.RestartAfter), start: []uint32{0}},
		"a recovery acted lately": {placement: map[uint32]string{0: "node1"}, lastRegang: t0.Add(10 * time.Second),
			ranks: map[uint32]*rankInfo{0: {since: t0}}, now: t0.Add(cfg.RestartAfter + time.Second)},
		"done": {placement: map[uint32]string{0: "node1"},
			ranks: map[uint32]*rankInfo{0: {since: t0, done: true}}, now: t0.Add(time.Hour)},
		// A rank placed here that this supervisor never ran (its event was
		// missed) waits from its first sighting.
		"first seen now": {placement: map[uint32]string{2: "node1"}, now: t0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { run(t, tc) })
	}
}

func TestDecideRemembersFirstSighting(t *testing.T) {
	cfg := DefaultConfig()
	ranks := map[uint32]*rankInfo{}
	t0 := time.Now()
	placement := map[uint32]string{2: "node1"}
	if _, start := decide("node1", placement, nil, ranks, time.Time{}, t0, cfg); len(start) != 0 {
		t.Fatal("started at first sight")
	}
	if _, start := decide("node1", placement, nil, ranks, time.Time{}, t0.Add(cfg.RestartAfter), cfg); !slices.Equal(start, []uint32{2}) {
		t.Fatalf("not started after RestartAfter: %v", start)
	}
}

func TestPrefixedLines(t *testing.T) {
	var b bytes.Buffer
	o := &output{out: &b}
	w := o.prefixed("[rank 3] ")
	for _, p := range []string{"step 1 di", "gest aa\nstep 2", " digest bb\n", "no newline yet"} {
		if _, err := w.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	o.printf("started rank %d", 4)
	want := "[rank 3] step 1 digest aa\n[rank 3] step 2 digest bb\n[node] started rank 4\n"
	if b.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", b.String(), want)
	}
	// A line longer than maxLine is cut rather than kept forever.
	b.Reset()
	w = o.prefixed("> ")
	if _, err := w.Write([]byte(strings.Repeat("x", maxLine+10))); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(b.String(), "\n"); n != 1 {
		t.Fatalf("%d lines written for an overlong line", n)
	}
}

func TestValidate(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Validate(); err == nil {
		t.Fatal("an empty config is valid")
	}
	cfg.Node, cfg.Job, cfg.Exe, cfg.Socket, cfg.WorldSize = "n", "j", "/rewind-dev", "/s", 2
	cfg.InitialRanks = []uint32{2}
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "initial rank 2 is not below the world size 2") {
		t.Fatalf("validate: %v", err)
	}
}

// TestRanksGetTheJobToken: a rank the supervisor launches finds its job's
// token in $REWIND_JOB_TOKEN, where the SDK looks for it; without a token
// the environment is the supervisor's own.
func TestRanksGetTheJobToken(t *testing.T) {
	s := &supervisor{cfg: Config{Exe: "/bin/true", Socket: "/s", Job: "j", WorldSize: 1, JobToken: "rwj1.x"}, out: &output{out: io.Discard}}
	if env := s.command(0, 1, "", -1).Env; !slices.Contains(env, "REWIND_JOB_TOKEN=rwj1.x") {
		t.Fatalf("rank's environment lacks the job token: %v", env)
	}
	s.cfg.JobToken = ""
	if env := s.command(0, 1, "", -1).Env; env != nil {
		t.Fatalf("rank's environment without a token: %v, want the supervisor's (nil)", env)
	}
}
