package coordinator_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// Saved by 4 ranks, rank r on node r%2: "big", U8 [4096, 4096] (16 MiB),
// 1024 rows to each rank (4 MiB, four 1 MiB leaves); "bias", F32 [13],
// saved whole by ranks 0 and 1 (copies on both nodes).
const bigRows, bigCols, biasLen = 4096, 4096, 13

func reshardModel() (big, bias []byte) {
	big, bias = make([]byte, bigRows*bigCols), make([]byte, biasLen*4)
	for i := range big {
		big[i] = byte(i*7 + i>>12 + 3)
	}
	for i := range bias {
		bias[i] = byte(i*5 + 1)
	}
	return big, bias
}

func saveReshardModel(t *testing.T, cl *cluster, job string, step int64) (big, bias []byte) {
	t.Helper()
	big, bias = reshardModel()
	const rows = bigRows / 4
	for r := range uint32(4) {
		s, err := cl.clients[r%2].Session(job, r, 4)
		if err != nil {
			t.Fatal(err)
		}
		off := int64(r) * rows
		ts := []sdk.Tensor{{Name: "big", DType: shm.U8, Shape: []int64{rows, bigCols}, Data: big[off*bigCols : (off+rows)*bigCols],
			Chunk: &shm.Chunk{GlobalShape: []int64{bigRows, bigCols}, Offsets: []int64{off, 0}}}}
		if r < 2 {
			ts = append(ts, sdk.Tensor{Name: "bias", DType: shm.F32, Shape: []int64{biasLen}, Data: bias})
		}
		if err := s.Save(ctxT(t), step, ts, map[string]uint32{"rank": r}); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	cl.waitLatest(job, step)
	return big, bias
}

// restoreNewRank restores new rank j of 8 (rows 512j to 512j+511 of big,
// and bias) on node's agent.
func restoreNewRank(t *testing.T, cl *cluster, node int, job string, j int, big, bias []byte) *sdk.Resharded {
	t.Helper()
	res, err := tryRestoreNewRank(t, cl, node, job, j, big, bias)
	if err != nil {
		t.Fatalf("new rank %d of 8 on node-%d: %v", j, node, err)
	}
	if res.SavedWorldSize != 4 || string(res.Objects) != `{"rank":0}` {
		t.Fatalf("new rank %d: %+v", j, res)
	}
	return res
}

// tryRestoreNewRank is restoreNewRank, returning its error.
func tryRestoreNewRank(t *testing.T, cl *cluster, node int, job string, j int, big, bias []byte) (*sdk.Resharded, error) {
	t.Helper()
	const rows = bigRows / 8
	s, err := cl.clients[node].Session(job, uint32(j), 8)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	off := int64(j) * rows
	l := sdk.Layout{Slices: []sdk.Slice{
		{Name: "big", DType: shm.U8, Offsets: []int64{off, 0}, Lengths: []int64{rows, bigCols}, Data: big[off*bigCols : (off+rows)*bigCols]},
		{Name: "bias", DType: shm.F32, Offsets: []int64{0}, Lengths: []int64{biasLen}, Data: bias},
	}}
	return s.RestoreInto(ctxT(t), l)
}

// restoreRanged restores all 8 new ranks of job (rank j on the node
// nodeOf(j) gives) on nodes that hold none of its shards: each must fetch
// exactly its rows' two 1 MiB leaves of big and bias's one leaf, in
// ranges, and the tensors assembled from them must be the saved ones;
// from says where the ranges come from, for the messages.
func restoreRanged(t *testing.T, cl *cluster, job string, nodeOf func(j int) int, big, bias []byte, from string) {
	t.Helper()
	gotBig := make([]byte, len(big))
	for j := range 8 {
		gotBias := make([]byte, len(bias))
		res := restoreNewRank(t, cl, nodeOf(j), job, j, gotBig, gotBias)
		if want := int64(2<<20 + len(bias)); res.Fetched != want {
			t.Errorf("new rank %d: %d bytes fetched from %s, want %d (its rows' leaves and bias, each once)", j, res.Fetched, from, want)
		}
		if !bytes.Equal(gotBias, bias) {
			t.Fatalf("new rank %d: bias differs from the saved one", j)
		}
	}
	if !bytes.Equal(gotBig, big) {
		t.Fatal("the tensor assembled from the new ranks differs from the saved one")
	}
}

// TestReshardAcrossNodes: a step saved by 4 ranks on two nodes restores
// at world size 8 on a third node that holds none of its shards: each new
// rank's agent fetches from the peers exactly the 1 MiB leaves its slices
// touch (2 MiB of big and bias's one leaf, of 16 MiB saved), the global
// tensors assembled from the 8 new ranks are the saved ones bit for bit,
// and the node is left holding no shard and no partial file.
func TestReshardAcrossNodes(t *testing.T) {
	cl := newCluster(t, 3)
	big, bias := saveReshardModel(t, cl, "rsx", 4)
	restoreRanged(t, cl, "rsx", func(int) int { return 2 }, big, bias, "the peers")
	shards, err := cl.clients[2].List(ctxT(t), "rsx")
	if err != nil || len(shards) != 0 {
		t.Fatalf("node-2 holds %d shards after ranged reads (%v), want none", len(shards), err)
	}
	left, err := os.ReadDir(filepath.Join(cl.agents[2].Config.ShmRoot, ".partial"))
	if err != nil && !errors.Is(err, os.ErrNotExist) || len(left) != 0 {
		t.Fatalf("partial files left on node-2 after every lease was released: %v %v", left, err)
	}
	// A Fill outside the shard's tensors, or on a lease released, is
	// refused, naming why.
	api := cl.clients[2].API()
	resp, err := api.Open(ctxT(t), &agentpb.OpenRequest{Job: "rsx", Rank: 1, Step: 4, Ranged: true, Peer: true})
	if err != nil || !resp.Partial {
		t.Fatalf("a ranged open of a shard node-2 lacks: partial %t, %v", resp.GetPartial(), err)
	}
	bad := map[string]*agentpb.ByteRange{
		"in the header":      {Offset: 0, Length: 8},
		"past the end":       {Offset: resp.Shard.SizeBytes - 1, Length: 2},
		"empty":              {Offset: resp.Shard.SizeBytes - 1, Length: 0},
		"wrapping past 2^64": {Offset: 1 << 62, Length: 1<<64 - 1<<62},
	}
	for name, r := range bad {
		if _, err := api.Fill(ctxT(t), &agentpb.FillRequest{Lease: resp.Lease, Ranges: []*agentpb.ByteRange{r}}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("a Fill of a range %s: %v, want InvalidArgument", name, err)
		}
	}
	if _, err := api.Release(ctxT(t), &agentpb.ReleaseRequest{Lease: resp.Lease}); err != nil {
		t.Fatal(err)
	}
	ok := &agentpb.ByteRange{Offset: resp.Shard.SizeBytes - 1, Length: 1}
	// Not NotFound: a restore would take that for "no checkpoint".
	if _, err := api.Fill(ctxT(t), &agentpb.FillRequest{Lease: resp.Lease, Ranges: []*agentpb.ByteRange{ok}}); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "open the shard again") {
		t.Errorf("a Fill on a released lease: %v, want FailedPrecondition, open the shard again", err)
	}
	// The leases are released as the restores return; each gave back
	// what its fetches were charged.
	st, err := cl.clients[2].Status(ctxT(t))
	if err != nil || st.UsedBytes != 0 {
		t.Fatalf("node-2's budget in use after the ranged reads: %d bytes (%v), want 0", st.GetUsedBytes(), err)
	}
	// A Fill that fetches nothing (the only holder is gone) keeps none of
	// the budget it reserved.
	resp, err = api.Open(ctxT(t), &agentpb.OpenRequest{Job: "rsx", Rank: 1, Step: 4, Ranged: true, Peer: true})
	if err != nil || !resp.Partial {
		t.Fatalf("a ranged open of a shard node-2 lacks: partial %t, %v", resp.GetPartial(), err)
	}
	before, _ := cl.clients[2].Status(ctxT(t))
	cl.agents[1].Stop()
	if _, err := api.Fill(ctxT(t), &agentpb.FillRequest{Lease: resp.Lease, Ranges: []*agentpb.ByteRange{ok}}); err == nil {
		t.Fatal("a Fill from a holder that is gone succeeded")
	}
	if after, _ := cl.clients[2].Status(ctxT(t)); after.GetUsedBytes() != before.GetUsedBytes() {
		t.Fatalf("a failed Fill left node-2's budget use at %d bytes, %d before it", after.GetUsedBytes(), before.GetUsedBytes())
	}
}

// TestRangedReadOfALargeShard: a shard larger than the largest header
// (100 MiB) is read in ranges too: new rank 1 of 2 on node-1 fetches the
// one 1 MiB row it asks for of a 105 MiB tensor node-0 holds.
func TestRangedReadOfALargeShard(t *testing.T) {
	cl := newCluster(t, 2)
	const rows, row = 105, 1 << 20
	huge := make([]byte, rows*row)
	for i := range huge {
		huge[i] = byte(i>>20 + i)
	}
	s, err := cl.clients[0].Session("rsl", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(ctxT(t), 1, []sdk.Tensor{{Name: "huge", DType: shm.U8, Shape: []int64{rows, row}, Data: huge}}, nil); err != nil {
		t.Fatal(err)
	}
	s.Close()
	cl.waitLatest("rsl", 1)
	s, err = cl.clients[1].Session("rsl", 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := make([]byte, row)
	res, err := s.RestoreInto(ctxT(t), sdk.Layout{Slices: []sdk.Slice{{Name: "huge", DType: shm.U8, Offsets: []int64{50, 0}, Lengths: []int64{1, row}, Data: got}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Fetched != row || !bytes.Equal(got, huge[50*row:51*row]) {
		t.Fatalf("row 50 of a 105 MiB shard: %d bytes fetched (want %d), equal %t", res.Fetched, row, bytes.Equal(got, huge[50*row:51*row]))
	}
}

// TestPartialLeaseExpires: a reader that opened a shard partially and
// died without releasing does not hold the node's memory: once its lease
// is past its TTL the partial file goes and its budget comes back.
func TestPartialLeaseExpires(t *testing.T) {
	cl := &cluster{t: t, dataDir: t.TempDir()}
	cl.addr, cl.stop = startCoordinator(t, cl.dataDir, "127.0.0.1:0")
	cl.dial()
	for i := range 2 {
		cl.addAgent(func(cfg *agent.Config) {
			cfg.Node, cfg.LeaseTTL = fmt.Sprintf("node-%d", i), 500*time.Millisecond
		})
	}
	cl.waitOrderStreams()
	saveReshardModel(t, cl, "rse", 3) // ranks 0 and 2 on node-0, 1 and 3 on node-1
	api := cl.clients[0].API()
	open := func() uint64 {
		resp, err := api.Open(ctxT(t), &agentpb.OpenRequest{Job: "rse", Rank: 1, Step: 3, Ranged: true, Peer: true})
		if err != nil || !resp.Partial {
			t.Fatalf("a ranged open of a shard node-0 lacks: partial %t, %v", resp.GetPartial(), err)
		}
		return resp.Lease
	}
	open() // never released
	dir := filepath.Join(cl.agents[0].Config.ShmRoot, ".partial")
	wait.ForNil(t, 20*time.Second, "the abandoned partial lease expired", func() error {
		lease := open() // a ranged open releases what expired
		if _, err := api.Release(ctxT(t), &agentpb.ReleaseRequest{Lease: lease}); err != nil {
			return err
		}
		left, _ := os.ReadDir(dir)
		st, err := cl.clients[0].Status(ctxT(t))
		if err != nil {
			return err
		}
		if len(left) != 0 || st.UsedBytes != node0Bytes(t, cl, "rse") {
			return fmt.Errorf("%d partial files, %d bytes of budget in use", len(left), st.UsedBytes)
		}
		return nil
	})
}

// node0Bytes is the bytes of the shards node-0 holds of job.
func node0Bytes(t *testing.T, cl *cluster, job string) uint64 {
	t.Helper()
	shards, err := cl.clients[0].List(ctxT(t), job)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, sh := range shards {
		n += sh.SizeBytes
	}
	return n
}

// TestReshardRangeFallsBackFromACorruptByte: a byte flipped in node-0's
// copy of bias (rank 0's, after the agent verified the shard) is caught
// by node-2's agent as that leaf arrives; the restore takes bias from
// rank 1's copy on node-1 and the rest of rank 0's ranges as fetched, and
// node-0, told by the refusal, finds its copy corrupt.
func TestReshardRangeFallsBackFromACorruptByte(t *testing.T) {
	cl := newCluster(t, 3)
	big, bias := saveReshardModel(t, cl, "rsc", 2)
	var path string
	var at int64
	wait.ForNil(t, 10*time.Second, "node-0's shards verified", func() error {
		shards, err := cl.clients[0].List(ctxT(t), "rsc")
		if err != nil {
			return err
		}
		for _, sh := range shards {
			if !sh.Verified {
				return fmt.Errorf("rank %d not verified yet", sh.Rank)
			}
			if sh.Rank == 0 {
				path = sh.Path
			}
		}
		return nil
	})
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	h, err := shm.Decode(f, statSize(t, f))
	if err != nil {
		t.Fatal(err)
	}
	at = h.DataStart + h.Tensor("bias").Begin + 9
	flip(t, f, at)
	f.Close()

	gotBig, gotBias := make([]byte, len(big)), make([]byte, len(bias))
	restoreNewRank(t, cl, 2, "rsc", 0, gotBig, gotBias)
	if !bytes.Equal(gotBias, bias) || !bytes.Equal(gotBig[:bigRows/8*bigCols], big[:bigRows/8*bigCols]) {
		t.Fatal("restored slices differ from the saved ones")
	}
	wait.ForNil(t, 10*time.Second, "node-0's copy of rank 0 found corrupt", func() error {
		shards, err := cl.clients[0].List(ctxT(t), "rsc")
		if err != nil {
			return err
		}
		for _, sh := range shards {
			if sh.Rank == 0 && sh.State != agentpb.ShardState_SHARD_STATE_CORRUPT {
				return fmt.Errorf("rank 0's shard is %v", sh.State)
			}
		}
		return nil
	})
}

func statSize(t *testing.T, f *os.File) int64 {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// flip inverts the bits of the byte at off of f.
func flip(t *testing.T, f *os.File, off int64) {
	t.Helper()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
