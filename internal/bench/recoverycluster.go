package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/internal/freeport"
	"rewind.dev/rewind/membership"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/shm"
	"rewind.dev/rewind/transport"
)

// The recovery benchmark's cluster: a coordinator in this process, agent
// processes of the rewind binary, and the job that saves on them.

// recNode is one agent process.
type recNode struct {
	name, dir, socket, listen string
	cmd                       *exec.Cmd
	exited                    chan struct{} // closed once the process is reaped
	logPath                   string
	client                    *sdk.Client
}

// recCluster is a coordinator in this process and its agent processes.
type recCluster struct {
	cfg      RecoveryConfig
	dataDir  string // coordinator store, agents' logs
	shmDir   string // agents' shm roots and sockets
	stop     context.CancelFunc
	stopped  chan struct{}
	coord    *coordinator.Coordinator
	conn     *grpc.ClientConn
	api      coordpb.CoordinatorClient
	nodes    []*recNode
	events   <-chan *coordpb.JobEvent // the job's recovery events
	unwatch  context.CancelFunc
	shutdown sync.Once
	// sec is nil: the recovery benchmark runs in plaintext on loopback
	// (its TLS cost is the peer benchmark's).
	sec *transport.Security
}

// startCluster starts the coordinator and the agents; on an error it
// leaves nothing behind.
func startCluster(ctx context.Context, cfg RecoveryConfig) (_ *recCluster, err error) {
	cl := &recCluster{cfg: cfg}
	defer func() {
		if err != nil {
			err = cl.withLogs(err)
			cl.close()
		}
	}()
	if cl.dataDir, err = os.MkdirTemp(cfg.DataDir, "rewind-bench-recovery-"); err != nil {
		return cl, err
	}
	if cl.shmDir, err = os.MkdirTemp(cfg.ShmDir, "rewind-bench-recovery-"); err != nil {
		return cl, err
	}
	addr, err := cl.startCoordinator()
	if err != nil {
		return cl, err
	}
	if cl.conn, err = cl.sec.NewClient(addr, transport.ExpectCoordinator); err != nil {
		return cl, err
	}
	cl.api = coordpb.NewCoordinatorClient(cl.conn)
	if err := cl.watch(ctx); err != nil {
		return cl, err
	}
	for i, d := range recoveryDomains {
		if err := cl.startAgent(ctx, fmt.Sprintf("node-%d", i), d, addr, cl.coord.GossipAddr()); err != nil {
			return cl, err
		}
	}
	return cl, nil
}

func (cl *recCluster) startCoordinator() (string, error) {
	logf, err := os.Create(filepath.Join(cl.dataDir, "coordinator.log"))
	if err != nil {
		return "", err
	}
	cfg := coordinator.DefaultConfig()
	cfg.ListenAddr, cfg.MetricsAddr, cfg.DataDir = "127.0.0.1:0", "", filepath.Join(cl.dataDir, "coordinator")
	cfg.Logger = slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	g := membership.DefaultConfig()
	g.BindAddr, g.BindPort, g.Logger = "127.0.0.1", 0, cfg.Logger
	cfg.Gossip, cfg.Replicas = &g, 1
	if cl.coord, err = coordinator.New(cfg); err != nil {
		logf.Close()
		return "", err
	}
	ctx, cancel := context.WithCancel(context.Background())
	cl.stop, cl.stopped = cancel, make(chan struct{})
	ready, failed := make(chan string, 1), make(chan error, 1)
	go func() {
		defer close(cl.stopped)
		defer logf.Close()
		failed <- cl.coord.Run(ctx, func(a, _ string) { ready <- a })
	}()
	select {
	case a := <-ready:
		return a, nil
	case err := <-failed:
		return "", fmt.Errorf("bench: coordinator: %w", err)
	case <-time.After(30 * time.Second):
		return "", errors.New("bench: coordinator not ready within 30 s")
	}
}

// startAgent runs `rewind agent` for node and waits for its socket.
func (cl *recCluster) startAgent(ctx context.Context, node, domain, coordAddr, gossipSeed string) error {
	n := &recNode{name: node, dir: filepath.Join(cl.shmDir, node), exited: make(chan struct{}),
		logPath: filepath.Join(cl.dataDir, node+".log")}
	n.socket = filepath.Join(n.dir, "a.sock")
	if err := os.MkdirAll(n.dir, 0o700); err != nil {
		return err
	}
	listen, err := freeport.Addr()
	if err != nil {
		return err
	}
	n.listen = listen
	logf, err := os.Create(n.logPath)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	warm := "0"
	if node == "node-2" { // the spare takes over the dead node's rank: a segment waits for it
		warm = fmt.Sprint(cl.cfg.Size + 16<<20)
	}
	n.cmd = exec.Command(cl.cfg.Binary, "agent", "--warm-segment", warm, "--node", node, "--failure-domain", domain,
		"--shm-root", filepath.Join(n.dir, "shm"), "--socket", n.socket, "--listen", listen, "--advertise", listen,
		"--metrics", "", "--coordinator", coordAddr, "--gossip", "127.0.0.1:0", "--gossip-join", gossipSeed, "--log-level", "warn")
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	if err := n.cmd.Start(); err != nil {
		return fmt.Errorf("bench: starting agent %s: %w", node, err)
	}
	cl.nodes = append(cl.nodes, n)
	go func() { n.cmd.Wait(); close(n.exited) }()
	return poll(ctx, 15*time.Second, "agent "+node+" to listen on its socket", func() (bool, error) {
		select {
		case <-n.exited:
			return false, fmt.Errorf("bench: agent %s exited: %s", node, n.cmd.ProcessState)
		default:
		}
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		c, err := sdk.Dial(dctx, n.socket, sdk.Options{CallTimeout: 2 * time.Minute})
		n.client = c
		return err == nil, nil
	})
}

// kill SIGKILLs the node's agent and waits for it to be reaped.
func (n *recNode) kill() {
	if n.cmd.Process != nil {
		n.cmd.Process.Kill()
		<-n.exited
	}
}

// close kills every agent, stops the coordinator and removes every file
// of the run. It may be called more than once.
func (cl *recCluster) close() {
	cl.shutdown.Do(func() {
		for _, n := range cl.nodes {
			if n.client != nil {
				n.client.Close()
			}
			n.kill()
		}
		if cl.unwatch != nil {
			cl.unwatch()
		}
		if cl.conn != nil {
			cl.conn.Close()
		}
		if cl.stop != nil {
			cl.stop()
			<-cl.stopped
			cl.coord.Close()
		}
		for _, d := range []string{cl.shmDir, cl.dataDir} {
			if d != "" {
				os.RemoveAll(d)
			}
		}
	})
}

// withLogs adds the end of every agent's log to err.
func (cl *recCluster) withLogs(err error) error {
	var b strings.Builder
	for _, n := range cl.nodes {
		data, _ := os.ReadFile(n.logPath)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 0 && lines[0] != "" {
			fmt.Fprintf(&b, "\n  %s: %s", n.name, strings.Join(lines[max(0, len(lines)-3):], "\n  "+n.name+": "))
		}
	}
	if b.Len() == 0 {
		return err
	}
	return fmt.Errorf("%w; agents' logs end:%s", err, b.String())
}

// train saves Steps steps of the job, rank r on node r. After each step
// it waits, as a job's checkpoint interval does, for the step to be
// consistent, replicated (two copies of every rank in memory) and
// verified by every agent, so the background work of one step does not
// overlap the next save.
func (cl *recCluster) train(ctx context.Context, src []byte) (int64, error) {
	per := (uint64(len(src)) / uint64(cl.cfg.Tensors)) &^ 3
	tensors := make([]sdk.Tensor, cl.cfg.Tensors)
	for i := range tensors {
		tensors[i] = sdk.Tensor{Name: fmt.Sprintf("layer.%02d.weight", i), DType: shm.F32, Shape: []int64{int64(per / 4)}, Data: src[uint64(i)*per : uint64(i+1)*per]}
	}
	steps := int64(cl.cfg.Steps)
	for step := int64(1); step <= steps; step++ {
		src[0] = byte(step) // each step's bytes differ
		if err := cl.saveStep(ctx, step, tensors); err != nil {
			return 0, cl.falseDeath(err)
		}
		if err := poll(ctx, 2*time.Minute, fmt.Sprintf("step %d to be consistent with 2 copies of every rank in memory", step), func() (bool, error) {
			if err := cl.falseDeath(nil); err != nil {
				return false, err
			}
			st, err := cl.inspect(ctx, step)
			return err == nil && st.State == coordpb.StepState_STEP_STATE_CONSISTENT && len(memCopies(st)) == recoveryRanks && minCopies(st) >= 2, nil
		}); err != nil {
			return 0, err
		}
		for _, n := range cl.nodes {
			if err := waitVerified(ctx, n.client, recoveryJob); err != nil {
				return 0, err
			}
		}
	}
	return steps, cl.falseDeath(nil)
}

// falseDeath returns an error naming the node failure detection declared
// dead although nothing was killed, if it did; else err.
func (cl *recCluster) falseDeath(err error) error {
	select {
	case ev := <-cl.events:
		if ev != nil {
			return fmt.Errorf("bench: failure detection declared a node dead with nothing killed (a false positive, such as probes timing out on a saturated machine): %s", ev.Reason)
		}
	default:
	}
	return err
}

// saveStep saves step for every rank at once, as a job's ranks do.
func (cl *recCluster) saveStep(ctx context.Context, step int64, tensors []sdk.Tensor) error {
	errs := make([]error, recoveryRanks)
	var wg sync.WaitGroup
	for r := range recoveryRanks {
		wg.Go(func() {
			s, err := cl.nodes[r].client.Session(recoveryJob, uint32(r), uint32(recoveryRanks))
			if err != nil {
				errs[r] = err
				return
			}
			defer s.Close()
			if err := s.Save(ctx, step, tensors, nil); err != nil {
				errs[r] = fmt.Errorf("bench: rank %d saving step %d: %w", r, step, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (cl *recCluster) inspect(ctx context.Context, step int64) (*coordpb.Step, error) {
	resp, err := cl.api.InspectStep(ctx, &coordpb.InspectStepRequest{Job: recoveryJob, Step: step})
	if err != nil {
		return nil, err
	}
	return resp.Step, nil
}

// memCopies returns, by rank, the committed copies of a step in shared
// memory.
func memCopies(st *coordpb.Step) map[uint32][]*coordpb.Copy {
	out := map[uint32][]*coordpb.Copy{}
	for _, c := range st.Copies {
		if c.Tier == "shm" && c.State == coordpb.CopyState_COPY_STATE_COMMITTED {
			out[c.Rank] = append(out[c.Rank], c)
		}
	}
	return out
}

func minCopies(st *coordpb.Step) int {
	n := -1
	for _, cs := range memCopies(st) {
		if n < 0 || len(cs) < n {
			n = len(cs)
		}
	}
	return n
}

// pickVictim returns the node to kill: the first of the job's nodes whose
// rank has no copy on the spare, so that its restore onto the spare moves
// bytes from a peer's memory. (A node's replicas go to the next node of
// another failure domain, so one of the two keeps its replica on the
// spare.) It also returns the peer holding the rank's replica, the ranks
// that move and their bytes.
func (cl *recCluster) pickVictim(ctx context.Context, step int64) (string, string, []uint32, uint64, error) {
	st, err := cl.inspect(ctx, step)
	if err != nil {
		return "", "", nil, 0, err
	}
	spare := cl.nodes[len(cl.nodes)-1].name
	copies := memCopies(st)
	for r := range uint32(recoveryRanks) {
		node, holder := cl.nodes[r].name, ""
		holders := map[string]uint64{}
		for _, c := range copies[r] {
			holders[c.Node] = c.SizeBytes
			if c.Node != node {
				holder = c.Node
			}
		}
		if _, onSpare := holders[spare]; !onSpare && holders[node] > 0 && holder != "" {
			return node, holder, []uint32{r}, holders[node], nil
		}
	}
	return "", "", nil, 0, fmt.Errorf("bench: every rank has a replica on the spare %s: no restore would move bytes from a peer", spare)
}

// watch opens the job's event stream; it stays open for the run.
func (cl *recCluster) watch(ctx context.Context) error {
	wctx, cancel := context.WithCancel(ctx)
	cl.unwatch = cancel
	stream, err := cl.api.WatchJob(wctx, &coordpb.WatchJobRequest{Job: recoveryJob})
	if err != nil {
		return err
	}
	events := make(chan *coordpb.JobEvent, 4)
	cl.events = events
	go func() {
		defer close(events)
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			events <- ev
		}
	}()
	time.Sleep(100 * time.Millisecond) // the stream is open on the coordinator
	return nil
}

// killAndWatch SIGKILLs victim's agent, removes its shared memory, and
// waits for the job's recovery event; it returns the event and the time
// of the kill.
func (cl *recCluster) killAndWatch(ctx context.Context, victim string) (*coordpb.JobEvent, time.Time, error) {
	if err := cl.falseDeath(nil); err != nil {
		return nil, time.Time{}, err
	}
	var n *recNode
	for _, x := range cl.nodes {
		if x.name == victim {
			n = x
		}
	}
	n.client.Close()
	n.client = nil
	killed := time.Now()
	n.kill()
	if err := os.RemoveAll(n.dir); err != nil {
		return nil, killed, err
	}
	var ev *coordpb.JobEvent
	select {
	case ev = <-cl.events:
	case <-ctx.Done():
		return nil, killed, ctx.Err()
	case <-time.After(time.Minute):
	}
	switch {
	case ev == nil:
		return nil, killed, fmt.Errorf("bench: no recovery event within a minute of killing %s", victim)
	case !ev.Ok:
		return ev, killed, fmt.Errorf("bench: recovery after killing %s failed: %s", victim, ev.Error)
	case !strings.Contains(ev.Reason, victim):
		return ev, killed, fmt.Errorf("bench: after killing %s, a recovery for another node: %s", victim, ev.Reason)
	}
	return ev, killed, nil
}

// grpcRead returns the best-of-n throughput of the restore's transfer
// alone: a gRPC Read of rank's shard of step from node's agent, dialed
// as agents dial their peers, into dst (already faulted in), with no new
// segment and no checksums.
func (cl *recCluster) grpcRead(ctx context.Context, node string, rank uint32, step int64, dst []byte, n int) (float64, error) {
	var addr string
	for _, x := range cl.nodes {
		if x.name == node {
			addr = x.listen
		}
	}
	conn, err := cl.sec.NewClient(addr, transport.ExpectNode(node))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var best float64
	for range n {
		t0 := time.Now()
		stream, err := agentpb.NewAgentClient(conn).Read(ctx, &agentpb.ReadRequest{Job: recoveryJob, Rank: rank, Step: step})
		if err != nil {
			return 0, fmt.Errorf("bench: gRPC Read from %s: %w", node, err)
		}
		got := 0
		for {
			chunk, err := stream.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				return 0, fmt.Errorf("bench: gRPC Read from %s: %w", node, err)
			}
			if chunk.Offset+uint64(len(chunk.Data)) > uint64(len(dst)) {
				return 0, fmt.Errorf("bench: gRPC Read from %s: chunk past %d bytes", node, len(dst))
			}
			got += copy(dst[chunk.Offset:], chunk.Data)
		}
		best = max(best, float64(got)/time.Since(t0).Seconds())
	}
	return best, nil
}

// poll calls f every 10 ms until it reports done or an error, ctx ends,
// or limit passes.
func poll(ctx context.Context, limit time.Duration, what string, f func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		done, err := f()
		if err != nil || done {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: waited %v for %s", limit, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
