package coordinator_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/agenttest"
	"rewind.dev/rewind/membership"
	"rewind.dev/rewind/sdk"
)

// childAgent is the test binary as an agent process, configured by
// REWIND_TEST_AGENT, "node,domain,shm root,socket,listen,coordinator,gossip seed".
func childAgent() int {
	f := strings.Split(os.Getenv("REWIND_TEST_AGENT"), ",")
	cfg := agent.DefaultConfig()
	cfg.Node, cfg.FailureDomain, cfg.ShmRoot, cfg.Socket = f[0], f[1], f[2], f[3]
	cfg.ListenAddr, cfg.AdvertiseAddr, cfg.CoordinatorAddr, cfg.MetricsAddr = f[4], f[4], f[5], ""
	if f[6] != "" {
		g := gossipConfig(nil)
		cfg.Gossip, cfg.GossipJoin = &g, []string{f[6]}
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	var err error
	if cfg.Faults, err = childFaults(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	a, err := agent.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := a.Run(ctx, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// gossipConfig is failure detection on loopback, on a free port.
func gossipConfig(faults *membership.FaultNetwork) membership.Config {
	g := membership.DefaultConfig()
	g.BindAddr, g.BindPort, g.Faults = "127.0.0.1", 0, faults
	g.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return g
}

// spawnAgent starts an agent process of the cluster (without failure
// detection when gossipSeed is empty), env added to its environment; it
// returns the process and the agent's shm root.
func (cl *cluster) spawnAgent(node, domain, gossipSeed string, env ...string) (*exec.Cmd, string) {
	t := cl.t
	cfg := agenttest.Config(t)
	listen := agenttest.FreePort(t)
	args := "REWIND_TEST_AGENT=" + strings.Join([]string{node, domain, cfg.ShmRoot, cfg.Socket, listen, cl.addr, gossipSeed}, ",")
	cmd := cl.startAgentProcess(args, env...)
	var c *sdk.Client
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err = sdk.Dial(ctxT(t), cfg.Socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent process %s: %v", node, err)
		}
	}
	t.Cleanup(func() { c.Close() })
	cl.clients = append(cl.clients, c)
	return cmd, cfg.ShmRoot
}

// startAgentProcess starts the test binary as an agent configured by args
// (REWIND_TEST_AGENT=...), env added to its environment.
func (cl *cluster) startAgentProcess(args string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "REWIND_TEST_ROLE=agent", args), env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// gossipCoordinator starts a coordinator that runs failure detection.
func gossipCoordinator(t *testing.T, faults *membership.FaultNetwork) (*cluster, string) {
	cl := &cluster{t: t, dataDir: t.TempDir()}
	g := gossipConfig(faults)
	c, addr, stop := runCoordinator(t, cl.dataDir, "127.0.0.1:0", func(cfg *coordinator.Config) { cfg.Gossip, cfg.Replicas = &g, 1 })
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
	var procs []*exec.Cmd
	var roots []string
	for i, d := range []string{"rack-a", "rack-b", "rack-a"} {
		p, root := cl.spawnAgent(fmt.Sprintf("node-%d", i), d, seed)
		procs, roots = append(procs, p), append(roots, root)
	}
	cl.saveSteps(job, ws, 2, 0, 1)
	waitReplicas(t, cl, job, 2, ws, 2)
	events := cl.watch(job)
	killed := time.Now()
	procs[1].Process.Kill()
	procs[1].Wait()
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
	cl, seed := gossipCoordinator(t, faults)
	for i := range 4 {
		cl.addAgent(func(cfg *agent.Config) {
			g := gossipConfig(faults)
			cfg.Node, cfg.FailureDomain = fmt.Sprintf("node-%d", i), fmt.Sprintf("rack-%d", i%2)
			cfg.Gossip, cfg.GossipJoin = &g, []string{seed}
		})
	}
	cl.saveStep(job, ws, 1, 0, 1, 2, 3)
	cl.waitLatest(job, 1)
	events := cl.watch(job)
	for _, far := range []string{"node-1", "node-2", "node-3"} {
		faults.Cut("coordinator", far)
		faults.Cut("node-0", far)
	}
	select {
	case ev := <-events:
		t.Fatalf("a recovery from the minority side of a partition: %v", ev)
	case <-time.After(6 * time.Second): // three times the detection bound
	}
	faults.Heal()
	time.Sleep(2 * time.Second)
	cl.saveStep(job, ws, 2, 0, 1, 2, 3)
	cl.waitLatest(job, 2)
	select {
	case ev := <-events:
		t.Fatalf("a recovery after the partition healed: %v", ev)
	default:
	}
}
