package bench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"rewind.dev/rewind/internal/testcluster"
)

// The benchmarks' own code must work; their figures come from `make bench`.
func TestSaveBenchRuns(t *testing.T) {
	rs, err := Save(context.Background(), SaveConfig{Sizes: []uint64{8 << 20}, Tensors: 4, Runs: 1, ShmDir: "/dev/shm"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].SaveWarm <= 0 || rs[0].SaveCold <= 0 || rs[0].Memcpy <= 0 {
		t.Fatalf("results %+v", rs)
	}
	var b strings.Builder
	PrintSave(&b, rs, 2)
	for _, want := range []string{"8.0 MiB", "warm/memcpy x2"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, b.String())
		}
	}
	if r := rs[0]; r.MemcpyParallel <= 0 || r.WarmToMemcpy <= 0 || r.WarmToMemcpyParallel <= 0 {
		t.Fatalf("no memcpy reference or ratio beside the warm saves: %+v", r)
	}
}

func TestCoordinatorBenchRuns(t *testing.T) {
	for _, tls := range []bool{false, true} {
		rs, err := Coordinator(context.Background(), CoordConfig{Ranks: []int{64}, RanksPerNode: 8, Steps: 3, DataDir: t.TempDir(), TLS: tls})
		if err != nil {
			t.Fatalf("tls %v: %v", tls, err)
		}
		if len(rs) != 1 || rs[0].Agents != 8 || rs[0].P99 <= 0 || rs[0].CommitsPerSec <= 0 || rs[0].AllocPerStep <= 0 {
			t.Fatalf("tls %v: results %+v", tls, rs)
		}
	}
}

// The default: the simulated agents in a process of their own, with TLS,
// their steps read back; every step is accounted to the collections or
// the others, and the table says so.
func TestCoordinatorBenchAgentsApart(t *testing.T) {
	rs, err := Coordinator(context.Background(), CoordConfig{Ranks: []int{64}, RanksPerNode: 8, Steps: 4, DataDir: t.TempDir(), TLS: true,
		AgentsCommand: testcluster.RoleCommand("coordinator-agents")})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.Agents != 8 || r.P99 <= 0 || r.CommitsPerSec <= 0 || r.AllocPerStep <= 0 {
		t.Fatalf("results %+v", r)
	}
	if r.GCSteps > 0 && r.GCStepP50 <= 0 || r.GCSteps < 4 && r.QuietP50 <= 0 {
		t.Fatalf("steps not split between collections and the others: %+v", r)
	}
	var b strings.Builder
	PrintCoordinator(&b, rs)
	for _, want := range []string{"alloc/step", "steps w/ GC", "others p99"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// A simulated agents' process that fails is an error that says so, not a
// result of no steps.
func TestCoordinatorBenchAgentsFailing(t *testing.T) {
	_, err := Coordinator(context.Background(), CoordConfig{Ranks: []int{16}, RanksPerNode: 8, Steps: 2, DataDir: t.TempDir(),
		AgentsCommand: []string{"false"}})
	if err == nil || !strings.Contains(err.Error(), "simulated agents") {
		t.Fatalf("err %v", err)
	}
}

func TestFileTierBenchRuns(t *testing.T) {
	r, err := FileTier(context.Background(), FileTierConfig{Dir: t.TempDir(), Size: 16 << 20, Runs: 1, Chunk: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if r.DD <= 0 || r.Store <= 0 {
		t.Fatalf("result %+v", r)
	}
}

// The peer restore benchmark's plumbing: a small shard, one run; every
// figure positive, every restore over the data path. Its figures come
// from `rewind-dev bench peer`.
func TestPeerBenchRuns(t *testing.T) {
	shmDir, err := os.MkdirTemp("/dev/shm", "rewind-test-")
	if err != nil {
		t.Skipf("the agents need /dev/shm: %v", err)
	}
	defer os.RemoveAll(shmDir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Peer(ctx, PeerConfig{Size: 8 << 20, Runs: 1, ShmDir: shmDir})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Runs[0]
	if r.Plain <= 0 || r.TLS <= 0 || r.BareTCP <= 0 || r.BareTLS <= 0 || res.TLSRatio <= 0 {
		t.Fatalf("run %+v", r)
	}
	var b strings.Builder
	PrintPeer(&b, res)
	t.Log(b.String())
	if !strings.Contains(b.String(), "peer restore TLS / bare TLS (per run)") {
		t.Fatalf("table lacks the ratio:\n%s", b.String())
	}
	if left, _ := os.ReadDir(shmDir); len(left) > 0 {
		t.Fatalf("shared memory left behind: %v", left)
	}
}
