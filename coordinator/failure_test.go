package coordinator_test

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/promtest"
	"rewind.dev/rewind/internal/testcluster"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/membership"
)

// spawnAgent starts an agent process of the cluster (without failure
// detection when gossipSeed is empty), env added to its environment; it
// returns the process and its configuration.
func (cl *cluster) spawnAgent(node, domain, gossipSeed string, env ...string) (*testcluster.Proc, testcluster.AgentProcess) {
	t := cl.t
	cfg := testcluster.AgentConfig(t)
	spec := testcluster.AgentProcess{Node: node, FailureDomain: domain, ShmRoot: cfg.ShmRoot, Socket: cfg.Socket,
		Listen: testcluster.FreeAddr(t), Coordinator: cl.addr, GossipSeed: gossipSeed}
	p := testcluster.SpawnAgent(t, spec, env...)
	cl.clients = append(cl.clients, testcluster.Dial(t, spec.Socket))
	return p, spec
}

// gossipCoordinator starts a coordinator that runs failure detection.
// mods change its configuration after that.
func gossipCoordinator(t *testing.T, faults *membership.FaultNetwork, mods ...func(*coordinator.Config)) (*cluster, string) {
	cl := &cluster{t: t, dataDir: t.TempDir()}
	g := testcluster.GossipConfig(faults)
	mods = append([]func(*coordinator.Config){func(cfg *coordinator.Config) { cfg.Gossip, cfg.Replicas = &g, 1 }}, mods...)
	c, addr, stop := runCoordinator(t, cl.dataDir, "127.0.0.1:0", mods...)
	cl.addr, cl.stop = addr, stop
	cl.dial()
	return cl, c.GossipAddr()
}

// TestFailureDetectionRecoversAKilledNode: three agent processes and a
// coordinator run failure detection; the node running rank 1 is killed
// (SIGKILL, its memory wiped); it is declared dead within seconds and the
// job is recovered onto the spare from the replica, with no operator.
func TestFailureDetectionRecoversAKilledNode(t *testing.T) {
	const job, ws = "detect", 2
	cl, seed := gossipCoordinator(t, nil)
	var procs []*testcluster.Proc
	var roots []string
	for i, d := range []string{"rack-a", "rack-b", "rack-a"} {
		p, spec := cl.spawnAgent(fmt.Sprintf("node-%d", i), d, seed)
		procs, roots = append(procs, p), append(roots, spec.ShmRoot)
	}
	cl.saveSteps(job, ws, 2, 0, 1)
	waitReplicas(t, cl, job, 2, ws, 2)
	events := cl.watch(job)
	killed := time.Now()
	procs[1].Kill()
	os.RemoveAll(filepath.Dir(roots[1]))
	ev := nextEvent(t, events)
	if !ev.Ok || ev.Step != 2 || ev.Placement[1] != "node-2" || !strings.Contains(ev.Reason, "declared dead") {
		t.Fatalf("recovery after the kill: %v", ev)
	}
	detected := time.Unix(0, ev.DetectedUnixNano).Sub(killed)
	t.Logf("declared dead %v after SIGKILL, planned %v later, restored %v after that", detected.Round(time.Millisecond),
		time.Duration(ev.PlannedUnixNano-ev.DetectedUnixNano).Round(time.Millisecond), time.Duration(ev.RestoredUnixNano-ev.PlannedUnixNano).Round(time.Millisecond))
	s, _ := cl.clients[2].Session(job, 1, ws)
	if got, err := s.RestoreStep(ctxT(t), 2); err != nil || string(got.Tensors[0].Data) != string(rankData(2, 1)) {
		t.Fatalf("rank 1 on the spare: %v", err)
	}
}

// TestPartitionDoesNotRecover: the coordinator and one agent are cut off
// from the other three agents. The coordinator sees three members die but
// no majority alive, so it recovers nothing; the other side has no
// coordinator. After the partition heals the job saves on where it ran.
func TestPartitionDoesNotRecover(t *testing.T) {
	const job, ws = "split", 4
	faults := membership.NewFaultNetwork()
	var logs testcluster.Logs
	reg := prometheus.NewRegistry()
	cl, seed := gossipCoordinator(t, faults, func(cfg *coordinator.Config) {
		cfg.Logger, cfg.Gossip.Registry = logs.Logger(slog.LevelInfo), reg
	})
	for i := range 4 {
		cl.addAgent(func(cfg *agent.Config) {
			g := testcluster.GossipConfig(faults)
			cfg.Node, cfg.FailureDomain = fmt.Sprintf("node-%d", i), fmt.Sprintf("rack-%d", i%2)
			cfg.Gossip, cfg.GossipJoin = &g, []string{seed}
		})
	}
	wait.For(t, 10*time.Second, "the coordinator to see every agent alive", func() bool { return members(t, reg, "alive") == 5 })
	cl.saveStep(job, ws, 1, 0, 1, 2, 3)
	cl.waitLatest(job, 1)
	events := cl.watch(job)
	far := []string{"node-1", "node-2", "node-3"}
	for _, n := range far {
		faults.Cut("coordinator", n)
		faults.Cut("node-0", n)
	}
	// Each far node is declared dead, and its recovery refused for want
	// of quorum (a recovery goes ahead only past that check).
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	})
	wait.For(t, 20*time.Second, "the coordinator to refuse to recover each far node", func() bool {
		for _, n := range far {
			if !logs.Has(`msg="not recovering"`, " node="+n+" ") {
				return false
			}
		}
		return true
	})
	select {
	case ev := <-events:
		t.Fatalf("a recovery from the minority side of a partition: %v", ev)
	default:
	}
	faults.Heal()
	wait.For(t, 20*time.Second, "the coordinator to see every agent alive after the partition healed", func() bool {
		return members(t, reg, "alive") == 5
	})
	cl.saveStep(job, ws, 2, 0, 1, 2, 3)
	cl.waitLatest(job, 2)
	select {
	case ev := <-events:
		t.Fatalf("a recovery after the partition healed: %v", ev)
	default:
	}
}

// members reads rewind_membership_members{state} from reg (-1: none).
func members(t *testing.T, reg *prometheus.Registry, state string) int {
	if v, ok := promtest.Samples(t, reg)[fmt.Sprintf("rewind_membership_members{state=%q}", state)]; ok {
		return int(v)
	}
	return -1
}
