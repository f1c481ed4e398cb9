package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/shm"
)

// peerPair starts two agents listening on loopback TCP; the holder saves
// one step of rank 0 (a few MiB, so that the copy crosses leaves and
// chunks) and the copy's PeerShard is returned. Neither verifies in the
// background; mod, if not nil, changes the receiver's configuration.
func peerPair(t *testing.T, mod func(*agent.Config)) (holder, receiver *testcluster.Agent, ps agent.PeerShard) {
	t.Helper()
	start := func(node string, mod func(*agent.Config)) *testcluster.Agent {
		cfg := testcluster.AgentConfig(t)
		cfg.Node, cfg.ListenAddr = node, "127.0.0.1:0"
		cfg.VerifyAfterCommit = false // only a copy's checks may notice damage
		if mod != nil {
			mod(&cfg)
		}
		return testcluster.StartAgent(t, cfg)
	}
	holder, receiver = start("holder", nil), start("receiver", mod)
	ctx := context.Background()
	c := testcluster.Dial(t, holder.Config.Socket)
	s, _ := c.Session("peer", 0, 1)
	if err := s.Save(ctx, 1, stateOf(0, 1), nil); err != nil {
		t.Fatal(err)
	}
	for _, sh := range holder.Agent.List("peer") {
		ps = agent.PeerShard{Job: "peer", Rank: 0, WorldSize: 1, Step: 1, Size: sh.Size, HeaderSum: sh.HeaderSum,
			Node: "holder", Addr: holder.Addrs.TCP}
	}
	return holder, receiver, ps
}

// stateAt is the state of job peer's rank 0 at step on a, "" when none.
func stateAt(a *agent.Agent, step int64) (state string, verified bool) {
	for _, sh := range a.List("peer") {
		if sh.Step == step {
			return string(sh.State), sh.Verified
		}
	}
	return "", false
}

// TestPeerCopyDamagedInFlight: a bit flipped in the receiver's memory as
// the shard's first bytes arrive (the fault point agent/replica-received)
// is caught by the checksums hashed as the bytes land: the copy fails as
// corrupt and nothing is committed; the holder's own copy is re-verified
// on the refusal and stays committed. The next copy arrives whole, is
// committed as verified (no second pass) and restores bit-identical.
func TestPeerCopyDamagedInFlight(t *testing.T) {
	in := faultinject.New(nil, 1)
	if err := in.Set("agent/replica-received=1*corrupt"); err != nil {
		t.Fatal(err)
	}
	holder, receiver, ps := peerPair(t, func(cfg *agent.Config) { cfg.Faults = in })
	ctx := context.Background()
	_, err := receiver.Agent.CopyFromPeer(ctx, ps, nil)
	if !errors.Is(err, shm.ErrCorrupt) {
		t.Fatalf("copy damaged in flight: %v, want a corrupt error", err)
	}
	if h := in.Hits()[faultinject.AgentReplicaReceived]; h != 1 {
		t.Fatalf("agent/replica-received fired %d times", h)
	}
	if st, _ := stateAt(receiver.Agent, 1); st == "committed" {
		t.Fatal("the damaged copy was committed")
	}
	if st, _ := stateAt(holder.Agent, 1); st != "committed" {
		t.Fatalf("the holder's whole copy is %q after an in-flight fault", st)
	}
	if n, err := receiver.Agent.CopyFromPeer(ctx, ps, nil); err != nil || n != ps.Size {
		t.Fatalf("second copy: %d bytes, %v", n, err)
	}
	if st, verified := stateAt(receiver.Agent, 1); st != "committed" || !verified {
		t.Fatalf("the whole copy is %q (verified %v)", st, verified)
	}
	checkRestores(t, receiver)
}

// checkRestores restores job peer's rank 0 at step 1 through r's SDK
// socket and compares it with what the holder saved.
func checkRestores(t *testing.T, r *testcluster.Agent) {
	t.Helper()
	ctx := context.Background()
	c := testcluster.Dial(t, r.Config.Socket)
	s, _ := c.Session("peer", 0, 1)
	got, err := s.RestoreStep(ctx, 1)
	if err != nil {
		t.Fatalf("restore of the copy: %v", err)
	}
	for _, want := range stateOf(0, 1) {
		if g := got.Tensor(want.Name); g == nil || !bytes.Equal(g.Data, want.Data) {
			t.Fatalf("restored tensor %q differs from the one saved", want.Name)
		}
	}
}

// TestPeerCopyRottenAtHolder: the holder sends its shard without
// verifying it first; a bit rotten in its memory is refused by the
// receiver, and the refusal has the holder verify its copy and mark it
// corrupt, so that it is not offered again.
func TestPeerCopyRottenAtHolder(t *testing.T) {
	holder, receiver, ps := peerPair(t, nil)
	path := ""
	for _, sh := range holder.Agent.List("peer") {
		path = sh.Path
	}
	testcluster.Flip(t, path, ps.Size-5) // inside the last tensor's bytes
	if _, err := receiver.Agent.CopyFromPeer(context.Background(), ps, nil); !errors.Is(err, shm.ErrCorrupt) {
		t.Fatalf("copy of a rotten shard: %v, want a corrupt error", err)
	}
	if st, _ := stateAt(receiver.Agent, 1); st == "committed" {
		t.Fatal("the rotten copy was committed")
	}
	wait.ForNil(t, 10*time.Second, "the holder's rotten copy marked corrupt after the receiver refused it", func() error {
		if st, _ := stateAt(holder.Agent, 1); st != "corrupt" {
			return fmt.Errorf("it is %q", st)
		}
		return nil
	})
}

// TestRestoreAdoptsWarmSegment: a restore from a peer onto a node with a
// warm segment fills that segment (renamed into the rank's slot) and
// restores bit-identical; a new warm segment is made once the copy is
// done.
func TestRestoreAdoptsWarmSegment(t *testing.T) {
	const warmSize = 8 << 20
	_, receiver, ps := peerPair(t, func(cfg *agent.Config) { cfg.WarmSegment = warmSize })
	warmPath := filepath.Join(receiver.Config.ShmRoot, ".warm")
	// A file named .warm is a warm segment ready to adopt (agent/warm.go).
	waitFile := func(what string) os.FileInfo {
		t.Helper()
		var fi os.FileInfo
		wait.ForNil(t, 10*time.Second, "a warm segment "+what, func() error {
			var err error
			if fi, err = os.Stat(warmPath); err == nil && fi.Size() != warmSize {
				err = fmt.Errorf("%s is %d bytes, want %d", warmPath, fi.Size(), warmSize)
			}
			return err
		})
		return fi
	}
	before := waitFile("at start")
	res, err := receiver.Agent.FetchFrom(context.Background(), ps, []agent.Source{{Tier: "shm", Node: "holder", Addr: ps.Addr}})
	if err != nil || res.Tier != "shm:holder" {
		t.Fatalf("restore from the peer: %+v, %v", res, err)
	}
	var slot string
	for _, sh := range receiver.Agent.List("peer") {
		slot = sh.Path
	}
	fi, err := os.Stat(slot)
	if err != nil || fi.Size() != ps.Size || !os.SameFile(fi, before) {
		t.Fatalf("the restored slot %s (%v) is not the warm segment, truncated to the shard", slot, err)
	}
	checkRestores(t, receiver)
	waitFile("after the restore")
}
