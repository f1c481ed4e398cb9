package testcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"rewind.dev/rewind/agent"
	"rewind.dev/rewind/coordinator"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/jobtoken"
	"rewind.dev/rewind/internal/wait"
	"rewind.dev/rewind/membership"
	"rewind.dev/rewind/sdk"
)

// The environment of a test binary re-executed in a role: the role's name,
// its configuration (JSON), and the seed of its fault injector.
const (
	envRole      = "REWIND_TEST_ROLE"
	envSpec      = "REWIND_TEST_SPEC"
	envFaultSeed = "REWIND_FAULT_SEED"
)

// A Role is what a re-executed test binary does instead of running the
// tests: it returns the process's exit status. The built-in roles are
// "agent" (SpawnAgent) and "coordinator" (SpawnCoordinator).
type Role func() int

// Main is the body of a TestMain: when the test binary was started by
// Spawn in a role (the built-in ones or those named in roles) it plays
// that role and exits; otherwise it runs the tests, removes what Binary
// built, and exits with their status.
func Main(m *testing.M, roles map[string]Role) {
	if name := os.Getenv(envRole); name != "" {
		role := roles[name]
		switch {
		case role != nil:
		case name == "agent":
			role = agentRole
		case name == "coordinator":
			role = coordinatorRole
		default:
			fmt.Fprintf(os.Stderr, "testcluster: no role %q in this test binary\n", name)
			os.Exit(2)
		}
		os.Exit(role())
	}
	code := m.Run()
	removeBuilt()
	removePKI()
	os.Exit(code)
}

// Proc is a process of the test binary, started by Spawn: killed and
// reaped when the test ends. Its standard output is read line by line
// (NextLine); its standard error is the test binary's.
type Proc struct {
	Cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
	err    error // Wait's, once exited is closed

	mu     sync.Mutex
	lines  []string      // written and not yet taken by NextLine
	eof    bool          // standard output closed
	posted chan struct{} // a token when lines or eof changed
}

// RoleCommand is the command line that starts the test binary in role
// (a role of Main's), for code that starts its own processes; arguments
// appended to it reach the role in os.Args.
func RoleCommand(role string) []string {
	return []string{"env", envRole + "=" + role, os.Args[0]}
}

// Spawn starts the test binary in role, with env added to its
// environment; the test binary's TestMain must call Main.
func Spawn(t testing.TB, role string, env ...string) *Proc {
	t.Helper()
	return spawn(t, role, env, 0)
}

// spawn is Spawn; unshare names the namespaces the process gets of its
// own (syscall.CLONE_NEWNS: mounts).
func spawn(t testing.TB, role string, env []string, unshare uintptr) *Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), env...), envRole+"="+role)
	// Killed with the test binary (a test's timeout panics it): an
	// orphan would hold go test's output pipe open, and go test waits.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Unshareflags: unshare}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Never written: it closes when this process ends, which ends a
	// process blocked in Hang (see there).
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("testcluster: start %s process: %v", role, err)
	}
	p := &Proc{Cmd: cmd, stdin: stdin, exited: make(chan struct{}), posted: make(chan struct{}, 1)}
	go func() {
		// Read all of it, whether or not the test takes the lines: a
		// process blocked writing its output would hang.
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.post(sc.Text(), false)
		}
		p.post("", true)
		p.err = cmd.Wait() // after the output is read, as exec requires
		close(p.exited)
	}()
	t.Cleanup(p.Kill)
	return p
}

func (p *Proc) post(line string, eof bool) {
	p.mu.Lock()
	if eof {
		p.eof = true
	} else {
		p.lines = append(p.lines, line)
	}
	p.mu.Unlock()
	select {
	case p.posted <- struct{}{}:
	default:
	}
}

// NextLine returns the next line the process writes to its standard
// output; it fails t if the process ends or timeout passes first.
func (p *Proc) NextLine(t testing.TB, timeout time.Duration) string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		if len(p.lines) > 0 {
			l := p.lines[0]
			p.lines = p.lines[1:]
			p.mu.Unlock()
			return l
		}
		eof := p.eof
		p.mu.Unlock()
		if eof {
			t.Fatalf("testcluster: process %d ended without writing a line", p.Cmd.Process.Pid)
		}
		select {
		case <-p.posted:
		case <-deadline.C:
			t.Fatalf("testcluster: process %d wrote no line within %v", p.Cmd.Process.Pid, timeout)
		}
	}
}

// Kill SIGKILLs the process, as a crash would, and waits until it is
// reaped. Killing an exited process does nothing.
func (p *Proc) Kill() {
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	p.stdin.Close()
}

// Hang blocks a role's process until it is killed, as a process hung at
// some point would be: it returns only when the test binary that spawned
// it ends first (its standard input, a pipe from there, closes), so that
// no such process outlives a test run.
func Hang() {
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// Exited reports whether the process has exited (by itself or killed).
func (p *Proc) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Wait waits for the process to exit and returns its status as exec.Cmd's
// Wait does.
func (p *Proc) Wait() error {
	<-p.exited
	return p.err
}

// AgentProcess configures an agent process (SpawnAgent).
type AgentProcess struct {
	Node, FailureDomain string
	ShmRoot, Socket     string
	Listen              string // TCP address, also advertised; "" for none
	Coordinator         string // "" for none
	GossipSeed          string // failure detection joining this member; "" for none
	Logs                bool   // log to the test binary's standard error (else discard)
	// TLSDir is the agent's certificate directory; empty: the test
	// nodes' shared one (NodeID), or none with REWIND_TEST_PLAINTEXT=1.
	TLSDir string
	// JobKey is the agent's job key file (jobtoken); empty: jobs are not
	// isolated.
	JobKey string
	// PrivateRoot gives the agent a shared-memory root nobody else can
	// open a file of: a tmpfs mounted over ShmRoot in a mount namespace
	// of the agent's own, as a training pod that mounts only the socket
	// directory sees it. Needs CAP_SYS_ADMIN (PrivateRootOK).
	PrivateRoot bool
}

// PrivateRootOK says why an AgentProcess with PrivateRoot cannot be
// started here, or "" when it can: it needs root.
func PrivateRootOK() string {
	if os.Geteuid() != 0 {
		return "a mount namespace of the agent's own needs root"
	}
	return ""
}

// SpawnAgent starts an agent process configured by spec, env added to its
// environment (a fault spec: faultinject.EnvSpec=...), and returns once
// it answers on its socket.
func SpawnAgent(t testing.TB, spec AgentProcess, env ...string) *Proc {
	t.Helper()
	spec.TLSDir = specTLSDir(t, spec.TLSDir, NodeID)
	var unshare uintptr
	if spec.PrivateRoot {
		if why := PrivateRootOK(); why != "" {
			t.Fatalf("testcluster: agent with a private root: %s", why)
		}
		unshare = syscall.CLONE_NEWNS // Go makes the new namespace's mounts private
	}
	p := spawn(t, "agent", append(env, specEnv(t, spec)), unshare)
	WaitAgent(t, p, spec.Socket)
	return p
}

// spawnSpec starts the test binary in role, configured by spec (passed
// as JSON in $REWIND_TEST_SPEC; the role reads it with readRole).
func spawnSpec(t testing.TB, role string, spec any, env []string) *Proc {
	t.Helper()
	return Spawn(t, role, append(env, specEnv(t, spec))...)
}

// specEnv is the environment entry that passes spec to a process.
func specEnv(t testing.TB, spec any) string {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	return envSpec + "=" + string(b)
}

// readRole reads the configuration spawnSpec passed into spec, and the
// process's fault injector (childFaults).
func readRole(role string, spec any) (*faultinject.Injector, error) {
	if err := json.Unmarshal([]byte(os.Getenv(envSpec)), spec); err != nil {
		return nil, fmt.Errorf("testcluster: %s spec: %w", role, err)
	}
	return childFaults()
}

// WaitAgent waits until an agent answers on socket, failing t when p (the
// agent's process) exits first or 20 s pass.
func WaitAgent(t testing.TB, p *Proc, socket string) {
	t.Helper()
	wait.ForNil(t, 20*time.Second, "an agent answering on "+socket, func() error {
		if p.Exited() {
			t.Fatalf("testcluster: the agent process for %s exited: %v", socket, p.Wait())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := sdk.Dial(ctx, socket)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// agentRole is the test binary as an agent process, configured by
// $REWIND_TEST_SPEC (an AgentProcess) and armed from $REWIND_FAULTS.
func agentRole() int {
	var spec AgentProcess
	faults, err := readRole("agent", &spec)
	if err != nil {
		return fail(err)
	}
	if spec.PrivateRoot { // in a mount namespace of its own (SpawnAgent)
		if err := os.MkdirAll(spec.ShmRoot, 0o700); err != nil {
			return fail(err)
		}
		if err := syscall.Mount("tmpfs", spec.ShmRoot, "tmpfs", 0, "mode=0700"); err != nil {
			return fail(fmt.Errorf("testcluster: a private shared-memory root: %w", err))
		}
	}
	cfg := agent.DefaultConfig()
	cfg.Faults = faults
	cfg.Node, cfg.FailureDomain, cfg.ShmRoot, cfg.Socket = spec.Node, spec.FailureDomain, spec.ShmRoot, spec.Socket
	cfg.ListenAddr, cfg.AdvertiseAddr, cfg.CoordinatorAddr, cfg.MetricsAddr = spec.Listen, spec.Listen, spec.Coordinator, ""
	if cfg.Transport, err = processTLS(spec.TLSDir); err != nil {
		return fail(err)
	}
	if spec.JobKey != "" {
		if cfg.JobKeys, err = jobtoken.Load(spec.JobKey); err != nil {
			return fail(err)
		}
	}
	if spec.GossipSeed != "" {
		g := GossipConfig(nil)
		cfg.Gossip, cfg.GossipJoin = &g, []string{spec.GossipSeed}
	}
	if !spec.Logs {
		cfg.Logger = Discard()
	}
	a, err := agent.New(cfg)
	if err != nil {
		return fail(err)
	}
	return serveUntilTerm(func(ctx context.Context) error { return a.Run(ctx, nil) })
}

// CoordinatorProcess configures a coordinator process (SpawnCoordinator).
type CoordinatorProcess struct {
	Addr    string // the gRPC address to listen on
	DataDir string
	Metrics string // the metrics address (/debug/faults too); "" for none
	// Standby makes it a replica that took the leader lease at start (as
	// with leader election), its store its own, not its predecessor's.
	Standby    bool
	LeaveGrace time.Duration // 0: the default
	// TLSDir is the coordinator's certificate directory; empty: the test
	// coordinator's (CoordinatorID), or none with REWIND_TEST_PLAINTEXT=1.
	TLSDir string
}

// SpawnCoordinator starts a coordinator process configured by spec, env
// added to its environment (a fault spec, and its seed
// REWIND_FAULT_SEED=n). It does not wait for it to listen.
func SpawnCoordinator(t testing.TB, spec CoordinatorProcess, env ...string) *Proc {
	t.Helper()
	spec.TLSDir = specTLSDir(t, spec.TLSDir, CoordinatorID)
	return spawnSpec(t, "coordinator", spec, env)
}

// FaultSeed is the environment entry that seeds a process's fault
// injector.
func FaultSeed(seed uint64) string { return envFaultSeed + "=" + strconv.FormatUint(seed, 10) }

// coordinatorRole is the test binary as a coordinator process, configured
// by $REWIND_TEST_SPEC (a CoordinatorProcess) and armed from
// $REWIND_FAULTS.
func coordinatorRole() int {
	var spec CoordinatorProcess
	faults, err := readRole("coordinator", &spec)
	if err != nil {
		return fail(err)
	}
	cfg := coordinator.DefaultConfig()
	cfg.ListenAddr, cfg.MetricsAddr, cfg.DataDir = spec.Addr, spec.Metrics, spec.DataDir
	cfg.Logger, cfg.Faults = Discard(), faults
	if spec.Standby {
		cfg.Leading = func() bool { return true }
	}
	if spec.LeaveGrace > 0 {
		cfg.LeaveGrace = spec.LeaveGrace
	}
	if cfg.Transport, err = processTLS(spec.TLSDir); err != nil {
		return fail(err)
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		return fail(err)
	}
	return serveUntilTerm(func(ctx context.Context) error { return c.Run(ctx, nil) })
}

// childFaults is the injector of a process: armed from $REWIND_FAULTS,
// seeded by $REWIND_FAULT_SEED; nil when no spec is set.
func childFaults() (*faultinject.Injector, error) {
	if os.Getenv(faultinject.EnvSpec) == "" {
		return nil, nil
	}
	seed, _ := strconv.ParseUint(os.Getenv(envFaultSeed), 10, 64)
	return faultinject.FromEnv(nil, seed)
}

// serveUntilTerm runs a daemon until SIGTERM, and returns the exit status.
func serveUntilTerm(run func(context.Context) error) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fail(err)
	}
	return 0
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, err)
	return 1
}

// GossipKey encrypts the test clusters' gossip, as a real cluster's key
// file does (every process of a test binary, and its children, share it;
// it protects nothing but loopback traffic of tests).
var GossipKey = []byte("rewind test clusters' gossip key")

// GossipConfig is failure detection on loopback, on a port of its own
// choosing, faults (nil for none) on its network, its logs discarded;
// encrypted with GossipKey unless REWIND_TEST_PLAINTEXT=1.
func GossipConfig(faults *membership.FaultNetwork) membership.Config {
	g := membership.DefaultConfig()
	g.BindAddr, g.BindPort, g.Faults = "127.0.0.1", 0, faults
	if !Plaintext() {
		g.Keys = [][]byte{GossipKey}
	}
	g.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return g
}
