package sdk_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// Once the agent has verified the shards, a resharding restore checks the
// 1 MiB leaves it reads, against the leaf hashes the agent gives, and no
// more: a new rank of 8 reading a 1 MiB half of an old rank's 2 MiB piece
// hashes that half. A flipped byte in the half it reads is found, naming
// the piece; one in the other half is not its concern.
func TestReshardVerifiesOnlyTheLeavesItReads(t *testing.T) {
	c, _ := start(t, nil) // verification after commit on: the agent learns the leaves
	g := &global{name: "huge", dtype: shm.U8, shape: []int64{8192, 1024}, rows: []int64{2048, 2048, 2048, 2048}}
	g.data = pattern(11, 8192*1024)
	gs := []*global{g}
	saveSharded(t, c, "leaves", 3, gs, 4)
	waitVerified(t, c, "leaves")

	l := layoutFor(gs, 0, 8, 1) // rows 0-1023: the first leaf of old rank 0's piece
	res, err := session(t, c, "leaves", 0, 8).RestoreInto(ctxT(t), l)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(l.Slices[0].Data, g.data[:1024*1024]) {
		t.Fatal("restored bytes differ from the saved ones")
	}
	if res.Bytes != 1<<20 || res.Verified != 1<<20 {
		t.Fatalf("copied %d, hashed %d bytes; want 1 MiB each (the one leaf read)", res.Bytes, res.Verified)
	}

	path, off := pieceAt(t, c, "leaves", 0, 3, "huge")
	testcluster.Flip(t, path, off+1500*1024) // row 1500: old rank 0's second leaf
	if _, err := session(t, c, "leaves", 0, 8).RestoreInto(ctxT(t), layoutFor(gs, 0, 8, 1)); err != nil {
		t.Fatalf("restore of the leaf clear of the flipped byte: %v", err)
	}
	_, err = session(t, c, "leaves", 1, 8).RestoreInto(ctxT(t), layoutFor(gs, 1, 8, 1))
	if !errors.Is(err, sdk.ErrCorrupt) {
		t.Fatalf("restore over the flipped byte: %v, want ErrCorrupt", err)
	}
	for _, want := range []string{`tensor "huge"`, "rank 0", "step 3", "leaf 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not name %s", err, want)
		}
	}
}
