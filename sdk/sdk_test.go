package sdk_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
)

type roundTripCase struct {
	tensors []sdk.Tensor
	objects any
}

func TestSaveRestoreBitIdentical(t *testing.T) {
	c, _ := start(t, nil)
	var every []sdk.Tensor
	for i, dt := range []shm.DType{shm.Bool, shm.U8, shm.I8, shm.F8E5M2, shm.F8E4M3, shm.I16, shm.U16, shm.F16, shm.BF16, shm.I32, shm.U32, shm.F32, shm.F64, shm.I64, shm.U64, shm.C64} {
		every = append(every, tensor("t."+string(dt), dt, uint64(i), 3, 5))
	}
	var many []sdk.Tensor
	for i := range 300 {
		many = append(many, tensor("layers."+string(rune('a'+i%26))+"."+strings.Repeat("x", i%7)+"."+string(rune('0'+i/26)), shm.F16, uint64(i), int64(i%9)))
	}
	cases := map[string]roundTripCase{
		"every dtype":              {tensors: every},
		"scalar":                   {tensors: []sdk.Tensor{tensor("lr", shm.F32, 1)}},
		"empty tensors":            {tensors: []sdk.Tensor{tensor("e0", shm.F32, 1, 0), tensor("e1", shm.I64, 2, 3, 0), tensor("x", shm.U8, 3, 5)}},
		"only empty":               {tensors: []sdk.Tensor{tensor("e", shm.F32, 1, 0)}},
		"no tensors, only objects": {objects: map[string]any{"epoch": 3, "loader": map[string]int{"pos": 1234}}},
		"large, not leaf-aligned":  {tensors: []sdk.Tensor{tensor("big", shm.F32, 9, 3*shm.LeafSize/4*4+5), tensor("small", shm.BF16, 1, 3)}},
		"300 MiB":                  {tensors: []sdk.Tensor{large("huge", 300<<20+12), tensor("bias", shm.F32, 2, 7)}},
		"many small":               {tensors: many},
		"names needing escapes":    {tensors: []sdk.Tensor{tensor(`a"b\c`, shm.F32, 1, 2), tensor("μ<&>", shm.F32, 2, 2)}},
		"objects with strings":     {tensors: []sdk.Tensor{tensor("w", shm.F32, 1, 4)}, objects: map[string]any{"rng": "AAEC/w==", "note": "ünïcode \"quoted\""}},
	}
	var step int64
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			step++
			runRoundTrip(t, c, name, step, tc)
		})
	}
}

// large returns a U8 tensor of n bytes: a 1 MiB pattern tiled, each tile
// stamped with its index so that misplaced tiles cannot go unnoticed.
func large(name string, n int) sdk.Tensor {
	tile := pattern(77, shm.LeafSize)
	data := make([]byte, n)
	for off, i := 0, 0; off < n; off, i = off+len(tile), i+1 {
		copy(data[off:], tile)
		copy(data[off:], fmt.Sprintf("tile %d", i))
	}
	return sdk.Tensor{Name: name, DType: shm.U8, Shape: []int64{int64(n)}, Data: data}
}

func runRoundTrip(t *testing.T, c *sdk.Client, name string, step int64, tc roundTripCase) {
	job := "rt-" + strings.NewReplacer(" ", "-", ",", "").Replace(name)
	s := session(t, c, job, 0, 1)
	ctx := ctxT(t)
	if err := s.Save(ctx, step, tc.tensors, tc.objects); err != nil {
		t.Fatal(err)
	}
	got, err := s.Restore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Step != step || got.Job != job || got.Rank != 0 {
		t.Fatalf("restored job %s rank %d step %d, saved job %s rank 0 step %d", got.Job, got.Rank, got.Step, job, step)
	}
	same(t, tc.tensors, got)
	if tc.objects != nil {
		want, _ := json.Marshal(tc.objects)
		if string(got.Objects) != string(want) {
			t.Fatalf("objects: restored %s, saved %s", got.Objects, want)
		}
	} else if got.Objects != nil {
		t.Fatalf("objects: restored %s, saved none", got.Objects)
	}
}

func TestLatestAndOlderSteps(t *testing.T) {
	c, _ := start(t, nil)
	s := session(t, c, "steps", 0, 1)
	ctx := ctxT(t)
	if _, ok, err := s.Latest(ctx); err != nil || ok {
		t.Fatalf("Latest before any save = ok %v, err %v; want none", ok, err)
	}
	if _, err := s.Restore(ctx); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("Restore before any save: %v, want ErrNotFound", err)
	}
	for step := int64(1); step <= 5; step++ {
		if err := s.Save(ctx, step, state(step), map[string]int64{"step": step}); err != nil {
			t.Fatal(err)
		}
		if got, ok, err := s.Latest(ctx); err != nil || !ok || got != step {
			t.Fatalf("Latest after saving %d = %d, %v, %v", step, got, ok, err)
		}
	}
	// Two slots: steps 5 (latest) and 4 are held; 3 was overwritten.
	for _, step := range []int64{4, 5} {
		got, err := s.RestoreStep(ctx, step)
		if err != nil {
			t.Fatalf("RestoreStep(%d): %v", step, err)
		}
		same(t, state(step), got)
	}
	if _, err := s.RestoreStep(ctx, 3); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("RestoreStep(3) after it was overwritten: %v, want ErrNotFound", err)
	}
	if st := s.LastSave(); st.Cold || st.Step != 5 {
		t.Fatalf("save of step 5 should reuse a warm segment: %+v", st)
	}
}

func TestRanksAndJobsAreIsolated(t *testing.T) {
	c, _ := start(t, nil)
	ctx := ctxT(t)
	type who struct {
		job  string
		rank uint32
	}
	all := []who{{"job-a", 0}, {"job-a", 1}, {"job-b", 0}}
	data := map[who][]sdk.Tensor{}
	for i, w := range all {
		s := session(t, c, w.job, w.rank, 2)
		data[w] = []sdk.Tensor{tensor("w", shm.F32, uint64(100+i), 64)}
		if err := s.Save(ctx, 7, data[w], nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range all {
		got, err := session(t, c, w.job, w.rank, 2).Restore(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got.Job != w.job || got.Rank != w.rank {
			t.Fatalf("%v restored the shard of %s rank %d", w, got.Job, got.Rank)
		}
		same(t, data[w], got)
	}
	if _, err := session(t, c, "job-b", 1, 2).Restore(ctx); !errors.Is(err, sdk.ErrNotFound) {
		t.Fatalf("job-b rank 1 never saved, Restore gave %v", err)
	}
}

func TestBadJobNamesRefused(t *testing.T) {
	c, r := start(t, nil)
	for _, job := range []string{"", ".", "..", "../etc", "a/b", "/abs", `a\b`, "with space", "nul\x00", strings.Repeat("x", 129)} {
		if _, err := c.Session(job, 0, 1); !errors.Is(err, sdk.ErrInvalid) {
			t.Errorf("Session(%q): %v, want ErrInvalid", job, err)
		}
		// The agent refuses them too, whatever a client sends.
		if _, err := r.Agent.Prepare(ctxT(t), job, 0, 1, 1, 8192); !errors.Is(err, agent.ErrInvalid) {
			t.Errorf("agent Prepare(%q): %v, want ErrInvalid", job, err)
		}
	}
	if _, err := c.Session("ok", 2, 2); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("rank 2 of world size 2 accepted: %v", err)
	}
	entries, _ := os.ReadDir(r.Config.ShmRoot)
	if len(entries) != 0 {
		t.Fatalf("refused names left %d entries under the shm root", len(entries))
	}
}

func TestLatestConsistentNeedsACoordinator(t *testing.T) {
	c, _ := start(t, nil)
	_, _, err := session(t, c, "alone", 0, 1).LatestConsistent(ctxT(t))
	if !errors.Is(err, sdk.ErrBusy) || !strings.Contains(err.Error(), "without a coordinator") {
		t.Fatalf("LatestConsistent on an agent without a coordinator: %v", err)
	}
}

func TestUnreachableCoordinatorIsNotAMissingAgent(t *testing.T) {
	c, _ := start(t, func(cfg *agent.Config) { cfg.CoordinatorAddr = testcluster.FreeAddr(t) })
	s := session(t, c, "lonely", 0, 1)
	_, _, err := s.LatestConsistent(ctxT(t))
	if !errors.Is(err, sdk.ErrCoordinatorUnavailable) || errors.Is(err, sdk.ErrNoAgent) {
		t.Fatalf("LatestConsistent with the coordinator down: %v, want ErrCoordinatorUnavailable", err)
	}
	// Restore refuses rather than guess a step other ranks may not have.
	if _, err := s.Restore(ctxT(t)); !errors.Is(err, sdk.ErrCoordinatorUnavailable) {
		t.Fatalf("Restore with the coordinator down: %v", err)
	}
}

func TestNoAgentIsAClearError(t *testing.T) {
	sock := testcluster.AgentConfig(t).Socket
	_, err := sdk.Dial(ctxT(t), sock)
	if !errors.Is(err, sdk.ErrNoAgent) || !strings.Contains(err.Error(), sock) {
		t.Fatalf("Dial with no agent: %v; want ErrNoAgent naming %s", err, sock)
	}
}

func TestSocketIsOwnerOnly(t *testing.T) {
	_, r := start(t, nil)
	fi, err := os.Stat(r.Config.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestBadTensorsRefused(t *testing.T) {
	c, _ := start(t, nil)
	s := session(t, c, "bad", 0, 1)
	ctx := ctxT(t)
	cases := map[string][]sdk.Tensor{
		"short data":     {{Name: "w", DType: shm.F32, Shape: []int64{4}, Data: make([]byte, 15)}},
		"unknown dtype":  {{Name: "w", DType: "F128", Shape: []int64{1}, Data: make([]byte, 16)}},
		"duplicate name": {tensor("w", shm.U8, 1, 2), tensor("w", shm.U8, 2, 2)},
		"negative dim":   {{Name: "w", DType: shm.U8, Shape: []int64{-1}}},
		"empty name":     {tensor("", shm.U8, 1, 2)},
	}
	for name, ts := range cases {
		if err := s.Save(ctx, 1, ts, nil); !errors.Is(err, sdk.ErrInvalid) {
			t.Errorf("%s: Save: %v, want ErrInvalid", name, err)
		}
	}
	if err := s.Save(ctx, -1, state(1), nil); !errors.Is(err, sdk.ErrInvalid) {
		t.Errorf("negative step: %v, want ErrInvalid", err)
	}
}
