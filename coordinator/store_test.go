package coordinator

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"
)

// TestStoreRoundTrip writes an index through Store (grouped and synced
// writes mixed), reopens it and checks Load rebuilds the same index.
func TestStoreRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	now := func() time.Time { return time.Unix(1_800_000_000, 0).UTC() }
	st, err := OpenStore(dir, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	s := NewState(now)
	write := func(f func(ch *Changes) error) {
		t.Helper()
		var ch Changes
		if err := f(&ch); err != nil {
			t.Fatal(err)
		}
		if err := st.Write(&ch); err != nil {
			t.Fatal(err)
		}
	}
	write(func(ch *Changes) error {
		_, err := s.RegisterJob("job-a", 3, map[uint32]string{0: "n0", 1: "n1", 2: "n2"}, ch)
		return err
	})
	for step := int64(1); step <= 4; step++ {
		for r := uint32(0); r < 3; r++ {
			if step == 4 && r == 2 {
				continue // step 4 stays partial
			}
			write(func(ch *Changes) error {
				return s.Apply(Record{Job: "job-a", Step: step, Rank: r, WorldSize: 3, Node: fmt.Sprintf("n%d", r), Size: 10 * uint64(step), Sum: "abc", State: "committed"}, ch)
			})
		}
	}
	for r := uint32(0); r < 3; r++ { // step 2's replicas: it is the protected step
		write(func(ch *Changes) error {
			return s.Apply(Record{Job: "job-a", Step: 2, Rank: r, WorldSize: 3, Node: fmt.Sprintf("n%d", (r+1)%3), Size: 20, Sum: "abc", State: "committed"}, ch)
		})
	}
	write(func(ch *Changes) error {
		return s.Apply(Record{Job: "job-a", Step: 1, Rank: 0, WorldSize: 3, Node: "n0", State: "deleted"}, ch)
	})
	// A copy found corrupt, and the step a restore found unrestorable.
	write(func(ch *Changes) error {
		return s.Apply(Record{Job: "job-a", Step: 1, Rank: 1, WorldSize: 3, Node: "n1", State: "corrupt"}, ch)
	})
	write(func(ch *Changes) error {
		return s.MarkUnrestorable("job-a", 1, &Unrestorable{At: now(), Ranks: []RankFailure{{Rank: 1, Copies: []CopyFailure{{Copy: "shm:n1", Error: "checksum", Corrupt: true}}}}}, ch)
	})
	if err := st.PutNode(&NodeInfo{Name: "n0", Addr: "n0:7070", FailureDomain: "rack-1"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st2, err := OpenStore(dir, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	got := NewState(now)
	if err := st2.Load(got); err != nil {
		t.Fatal(err)
	}
	want := showJob(s.Jobs["job-a"])
	if have := showJob(got.Jobs["job-a"]); have != want {
		t.Fatalf("reloaded index differs:\n%s\nwant:\n%s", have, want)
	}
	if n := got.Nodes["n0"]; n == nil || n.Addr != "n0:7070" || n.FailureDomain != "rack-1" {
		t.Fatalf("node n0 reloaded as %+v", n)
	}
	c := got.Jobs["job-a"].Steps[3].Copies[1][0]
	if c.Size != 30 || c.Sum != "abc" || c.Node != "n1" || c.Tier != "shm" || c.State != "committed" {
		t.Fatalf("copy reloaded as %+v", c)
	}
	// The protected step is rebuilt from the copies: it is not stored.
	if p := got.Jobs["job-a"].Protected; p != 2 {
		t.Fatalf("protected step reloaded as %d, want 2", p)
	}
	// rankLatest is rebuilt: a late step 2 report cannot un-abandon anything.
	if l := got.Jobs["job-a"].rankLatest[0]; l != 4 {
		t.Fatalf("rank 0 latest step reloaded as %d, want 4", l)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestStoreStepDroppedAndRecreated: a step whose last copy goes and comes
// back (or comes and goes) within one change is stored as it ends.
func TestStoreStepDroppedAndRecreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	now := func() time.Time { return time.Unix(1_800_000_000, 0).UTC() }
	st, err := OpenStore(dir, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	s := NewState(now)
	var ch Changes
	if _, err := s.RegisterJob("j", 2, nil, &ch); err != nil {
		t.Fatal(err)
	}
	rec := func(step int64, state string) Record {
		return Record{Job: "j", Step: step, Rank: 0, WorldSize: 2, Node: "n0", Sum: "s", State: CopyState(state)}
	}
	for _, r := range []Record{rec(1, "committed"), rec(1, "deleted"), rec(1, "committed"), rec(2, "committed"), rec(2, "deleted")} {
		if err := s.Apply(r, &ch); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Write(&ch); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st2, err := OpenStore(dir, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	got := NewState(now)
	if err := st2.Load(got); err != nil {
		t.Fatal(err)
	}
	if have, want := showJob(got.Jobs["j"]), showJob(s.Jobs["j"]); have != want {
		t.Fatalf("reloaded:\n%s\nwant:\n%s", have, want)
	}
}

// TestKeyEncoding: the hand-written key and value encoders write what the
// documented formats (and Load) say.
func TestKeyEncoding(t *testing.T) {
	for _, k := range []CopyKey{
		{Job: "j", Step: 0, Rank: 0, Tier: "shm", Node: "n"},
		{Job: "job-7", Step: 123456789, Rank: 8191, Tier: "s3", Node: "node-0001"},
		{Job: "x", Step: 1<<63 - 1, Rank: 1<<32 - 1, Tier: "nvme", Node: "a.b"},
	} {
		want := fmt.Sprintf("copy/%s/%020d/%010d/%s/%s", k.Job, k.Step, k.Rank, k.Tier, k.Node)
		if got := string(copyKey(k)); got != want {
			t.Errorf("copyKey = %q, want %q", got, want)
		}
	}
	c := &Copy{Size: 1 << 30, Sum: "0123abcd", State: "committed"}
	if got, want := string(encodeCopy(c)), "1073741824 0123abcd committed"; got != want {
		t.Fatalf("encodeCopy = %q, want %q", got, want)
	}
	back, err := decodeCopy(encodeCopy(c))
	if err != nil || *back != *c {
		t.Fatalf("decodeCopy(encodeCopy(%+v)) = %+v, %v", c, back, err)
	}
}
