package sdk_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

// scaleTensors is the optimizer state of a large mixture-of-experts
// model on one rank: n tensors of two F32 elements with the long names
// of such state (about 150 bytes: a module path, its expert, its
// parameter group), each tensor's bytes its index.
func scaleTensors(n int) []sdk.Tensor {
	ts := make([]sdk.Tensor, n)
	for i := range ts {
		data := make([]byte, 8)
		binary.LittleEndian.PutUint32(data, uint32(i))
		binary.LittleEndian.PutUint32(data[4:], ^uint32(i))
		ts[i] = sdk.Tensor{Name: fmt.Sprintf("optimizer.state.param_groups.0.model.decoder.transformer_layers.%03d.block_sparse_moe.experts.%03d.feed_forward.w%d.weight.exp_avg_sq", i/600, (i/3)%200, i%3),
			DType: shm.F32, Shape: []int64{2}, Data: data}
	}
	return ts
}

// TestSaveRestoreManyTensors saves 60,000 tensors with long names on one
// rank, as a large optimizer's state has, and restores them whole and in
// slices once the agent has verified the shard. The agent's answer to an
// open then carries every tensor's name and leaf hashes (9.5 MiB here),
// more than the 8 MiB the SDK received before.
func TestSaveRestoreManyTensors(t *testing.T) {
	if testing.Short() {
		t.Skip("saves 60,000 tensors: about 20 s of CPU under the race detector")
	}
	const n = 60_000
	_, a := start(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	// The default call timeout: the race detector slows parsing the
	// 23 MB header at the commit tenfold.
	c, err := sdk.Dial(ctx, a.Config.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := scaleTensors(n)
	if err := session(t, c, "scale", 0, 1).Save(ctx, 1, want, map[string]int{"tensors": n}); err != nil {
		t.Fatal(err)
	}
	waitVerified(t, c, "scale")

	got, err := session(t, c, "scale", 0, 1).Restore(ctx)
	if err != nil {
		t.Fatalf("restore of %d tensors: %v", n, err)
	}
	same(t, want, got)

	// Rank 1 of a gang of 2: the second element of every tensor.
	layout := sdk.Layout{Slices: make([]sdk.Slice, n)}
	for i, w := range want {
		layout.Slices[i] = sdk.Slice{Name: w.Name, DType: shm.F32, Offsets: []int64{1}, Lengths: []int64{1}, Data: make([]byte, 4)}
	}
	res, err := session(t, c, "scale", 1, 2).RestoreStepInto(ctx, 1, layout)
	if err != nil {
		t.Fatalf("reshard restore of %d tensors: %v", n, err)
	}
	if res.Bytes != 4*n {
		t.Fatalf("reshard restore copied %d bytes, want %d", res.Bytes, 4*n)
	}
	for i, sl := range layout.Slices {
		if !bytes.Equal(sl.Data, want[i].Data[4:]) {
			t.Fatalf("slice of %q: %x, saved %x", sl.Name, sl.Data, want[i].Data[4:])
		}
	}
}
