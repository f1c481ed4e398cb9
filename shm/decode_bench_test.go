package shm_test

import (
	"fmt"
	"testing"

	"rewind.dev/rewind/shm"
)

// manyTensorSpecs is the state of a large mixture-of-experts optimizer
// on one rank: n small tensors with the long names such models have,
// every third one a chunk of a sharded tensor.
func manyTensorSpecs(n int) []shm.TensorSpec {
	specs := make([]shm.TensorSpec, n)
	for i := range specs {
		specs[i] = shm.TensorSpec{Name: fmt.Sprintf("optimizer.state.model.layers.%d.mlp.experts.%d.w%d.exp_avg_sq", i/600, (i/3)%200, i%3),
			DType: shm.F32, Shape: []int64{4}}
		if i%3 == 0 {
			specs[i].Chunk = &shm.Chunk{GlobalShape: []int64{16}, Offsets: []int64{4}}
		}
	}
	return specs
}

// BenchmarkDecodeManyTensors decodes the header of a shard of many
// small tensors, as the agent does at every commit and a restore at
// every open: its cost must grow with the tensor count, not its square.
//
//	go test -run '^$' -bench DecodeManyTensors -benchtime 3x ./shm
func BenchmarkDecodeManyTensors(b *testing.B) {
	for _, n := range []int{10_000, 40_000, 160_000} {
		b.Run(fmt.Sprintf("tensors=%d", n), func(b *testing.B) {
			sh := buildShard(b, testMeta, manyTensorSpecs(n), nil)
			b.SetBytes(sh.layout.DataStart)
			b.ReportAllocs()
			for b.Loop() {
				h, err := shm.DecodeBytes(sh.file)
				if err != nil || len(h.Tensors) != n {
					b.Fatalf("decode: %d tensors, %v", len(h.Tensors), err)
				}
			}
		})
	}
}
