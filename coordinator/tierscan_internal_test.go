package coordinator

import (
	"path/filepath"
	"sync"
	"testing"

	"rewind.dev/rewind/tiers"
)

// TestATierCopyPushesOnlyFromCheckedNodes: the nodes a tier copy orders to push
// are the nodes the scan checked could write the tier (reachable) and had
// their tier listed (listed). Here the step's only rank is in node A's
// memory when the scan lists the due steps; while the scan waits after
// listing them, a replica of the rank commits on B, which cannot write
// nvme (no stream) and whose nvme was never listed, and A's copy goes. The copy that starts must not order B to push.
func TestATierCopyPushesOnlyFromCheckedNodes(t *testing.T) {
	c := nvmeEveryStep(t)
	tr := c.tiers
	if _, err := c.apply(func(ch *Changes) error {
		_, err := c.state.RegisterJob("j", 1, nil, ch)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	commit := func(node string, st CopyState) {
		t.Helper()
		if _, err := c.report(node, []Record{{Job: "j", Step: 1, Rank: 0, WorldSize: 1, Node: node, Size: 1, Sum: "s", State: st}}); err != nil {
			t.Fatal(err)
		}
	}
	commit("A", CopyCommitted)

	scanPaused(c, func() {
		commit("B", CopyCommitted) // a replica on B
		commit("A", CopyDeleted)   // A's copy goes: only B holds rank 0
	})

	c.mu.Lock()
	st := c.state.Jobs["j"].Steps[1]
	state, holders := st.State, len(st.Copies[0])
	c.mu.Unlock()
	if state != Consistent || holders != 1 {
		t.Fatalf("setup: step %s, %d copies of rank 0", state, holders)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tc := tr.copies[tierKey{"j", 1, "nvme"}]
	if tc == nil {
		return // not started: the next scan sees B cannot write nvme
	}
	for r, n := range tc.Holders {
		if n != "A" { // the only node reachable and listed checked
			_, bConnected := c.streams.tiersOf(n)
			t.Fatalf("tier copy started ordering rank %d's push from %s, which the scan never checked (holders %v; %s has a stream: %v, its nvme listed: %v)",
				r, n, tc.Holders, n, bConnected, tr.rd.done[listingKey("nvme", n)])
		}
	}
}

// TestATierCopyKeepsItsStepsWorldSize: a tier copy's world size is its holders'
// and manifest's. The step is dropped and saved again at another world
// size while the scan waits between dueSteps and holdersOf.
func TestATierCopyKeepsItsStepsWorldSize(t *testing.T) {
	c := nvmeEveryStep(t)
	tr := c.tiers
	register := func(ws uint32) {
		t.Helper()
		if _, err := c.apply(func(ch *Changes) error {
			_, err := c.state.RegisterJob("j", ws, nil, ch)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	report := func(ws uint32, rank uint32, st CopyState) {
		t.Helper()
		if _, err := c.report("A", []Record{{Job: "j", Step: 1, Rank: rank, WorldSize: ws, Node: "A", Size: 1, Sum: "s", State: st}}); err != nil {
			t.Fatal(err)
		}
	}
	register(1)
	report(1, 0, CopyCommitted)

	scanPaused(c, func() {
		report(1, 0, CopyDeleted) // the step leaves the index
		register(2)               // an elastic restart at world size 2
		report(2, 0, CopyCommitted)
		report(2, 1, CopyCommitted) // step 1 again, consistent at world size 2
	})

	tr.mu.Lock()
	defer tr.mu.Unlock()
	tc := tr.copies[tierKey{"j", 1, "nvme"}]
	if tc == nil {
		return
	}
	if int(tc.WorldSize) != len(tc.Holders) || int(tc.WorldSize) != len(tc.Shards) {
		t.Fatalf("tier copy of world size %d with %d holders %v and %d manifest shards", tc.WorldSize, len(tc.Holders), tc.Holders, len(tc.Shards))
	}
}

// nvmeEveryStep returns a coordinator whose job j goes to nvme at every
// step, node A connected with nvme and its nvme listed.
func nvmeEveryStep(t *testing.T) *Coordinator {
	t.Helper()
	c := newTestCoordinator(t, filepath.Join(t.TempDir(), "store"))
	t.Cleanup(func() { c.Close() })
	p, err := tiers.ParsePolicy("nvme:every=1,keep=3")
	if err != nil {
		t.Fatal(err)
	}
	c.streams.open("A", []string{"nvme"})
	c.tiers.mu.Lock()
	defer c.tiers.mu.Unlock()
	c.tiers.policies["j"] = p
	c.tiers.rd.done[listingKey("nvme", "A")] = true
	return c
}

// scanPaused runs a tier scan that stops once it has listed the due
// steps (dueSteps), runs meanwhile, then lets the scan finish.
func scanPaused(c *Coordinator, meanwhile func()) {
	listed, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once // the coordinator's own scans may come first
	setHook := func(f func()) {
		c.tiers.mu.Lock()
		defer c.tiers.mu.Unlock()
		c.tiers.dueListed = f
	}
	setHook(func() { once.Do(func() { close(listed) }); <-resume })
	defer setHook(nil)
	done := make(chan struct{})
	go func() { defer close(done); c.tiers.scan() }()
	<-listed
	meanwhile()
	close(resume)
	<-done
}
