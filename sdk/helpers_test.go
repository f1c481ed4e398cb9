package sdk_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// start runs an in-process agent, letting mod adjust its config, and
// returns a client connected to it.
func start(t testing.TB, mod func(*agent.Config)) (*sdk.Client, *testcluster.Agent) {
	t.Helper()
	cfg := testcluster.AgentConfig(t)
	if mod != nil {
		mod(&cfg)
	}
	r := testcluster.StartAgent(t, cfg)
	c, err := sdk.Dial(ctxT(t), cfg.Socket, sdk.Options{CallTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, r
}

func session(t *testing.T, c *sdk.Client, job string, rank, ws uint32) *sdk.Session {
	t.Helper()
	s, err := c.Session(job, rank, ws)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// pattern fills n bytes deterministically from seed.
func pattern(seed uint64, n int) []byte {
	b := make([]byte, n)
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

func tensor(name string, dt shm.DType, seed uint64, shape ...int64) sdk.Tensor {
	n, err := dt.NumBytes(shape)
	if err != nil {
		panic(err)
	}
	return sdk.Tensor{Name: name, DType: dt, Shape: shape, Data: pattern(seed, int(n))}
}

// state builds a small model state whose bytes depend on step.
func state(step int64) []sdk.Tensor {
	w := make([]byte, 4*1000)
	for i := range 1000 {
		binary.LittleEndian.PutUint32(w[4*i:], math.Float32bits(float32(step)*0.5+float32(i)))
	}
	return []sdk.Tensor{
		{Name: "w", DType: shm.F32, Shape: []int64{10, 100}, Data: w},
		tensor("b", shm.BF16, uint64(step), 17),
		tensor("count", shm.I64, uint64(step)+7),
	}
}

// same fails t unless got holds exactly the tensors want, in any order.
func same(t *testing.T, want []sdk.Tensor, got *sdk.Checkpoint) {
	t.Helper()
	if len(got.Tensors) != len(want) {
		t.Fatalf("restored %d tensors, saved %d", len(got.Tensors), len(want))
	}
	for _, w := range want {
		g := got.Tensor(w.Name)
		if g == nil {
			t.Fatalf("tensor %q missing after restore", w.Name)
		}
		if g.DType != w.DType || fmt.Sprint(g.Shape) != fmt.Sprint(nonNil(w.Shape)) {
			t.Fatalf("tensor %q: restored %s%v, saved %s%v", w.Name, g.DType, g.Shape, w.DType, w.Shape)
		}
		if !bytes.Equal(g.Data, w.Data) {
			t.Fatalf("tensor %q: restored bytes differ from saved ones", w.Name)
		}
	}
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}

// waitVerified waits until the agent has verified every shard of job
// (after their commit): it then gives readers the leaf hashes that a
// restore of part of a piece checks its reads against.
func waitVerified(tb testing.TB, c *sdk.Client, job string) {
	tb.Helper()
	wait.ForNil(tb, time.Minute, "the agent to verify the shards of "+job, func() error {
		shards, err := c.List(tb.Context(), job)
		if err != nil {
			return err
		}
		for _, sh := range shards {
			if !sh.Verified {
				return fmt.Errorf("rank %d step %d not verified yet", sh.Rank, sh.Step)
			}
		}
		return nil
	})
}
