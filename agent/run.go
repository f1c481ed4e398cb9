package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/internal/metricsrv"
	"rewind.dev/rewind/internal/segsock"
	"rewind.dev/rewind/shm"
)

// Version is the agent's version, reported by Status.
var Version = "dev"

// Run serves the agent until ctx is cancelled: gRPC on the Unix socket (and
// on TCP when configured), metrics over HTTP, and the background verifier.
// ready, when not nil, is called once every listener is open.
func (a *Agent) Run(ctx context.Context, ready func(Addrs)) error {
	uds, err := a.listenUnix()
	if err != nil {
		return err
	}
	seg, err := a.listenSocket(segsock.Network, segsock.Path(a.cfg.Socket))
	if err != nil {
		uds.Close()
		return err
	}
	defer seg.Close()
	srv := grpc.NewServer(a.cfg.Transport.ServerOption(),
		grpc.ChainUnaryInterceptor(a.auditor.Unary, a.authz.Unary, a.guardUnary, unaryErrors),
		grpc.ChainStreamInterceptor(a.auditor.Stream, a.authz.Stream, a.guardStream, streamErrors),
	)
	agentpb.RegisterAgentServer(srv, &server{a: a})
	var addrs Addrs
	addrs.Socket = a.cfg.Socket
	if a.cfg.ListenAddr != "" || a.cfg.CoordinatorAddr != "" {
		a.cfg.Transport.LogStart(a.log, "agent")
	}
	if !a.cfg.JobKeys.Enabled() {
		a.log.Warn("jobs are not isolated: every process that can open the socket reaches every job's checkpoints on this node; start the agent with --job-key",
			"socket", a.cfg.Socket)
	}
	errc := make(chan error, 3)
	go func() { errc <- srv.Serve(uds) }()
	go a.serveSegments(ctx, seg)
	if a.cfg.ListenAddr != "" {
		tcp, err := a.cfg.Transport.Listen("agent", a.cfg.ListenAddr)
		if err != nil {
			srv.Stop()
			return err
		}
		addrs.TCP = tcp.Addr().String()
		mux := newMuxListener(tcp, a) // gRPC, and the peer data path (peerdata.go)
		go func() { errc <- srv.Serve(mux) }()
	}
	var metrics *metricsrv.Server
	if a.cfg.MetricsAddr != "" {
		if metrics, err = metricsrv.Start(metricsrv.Config{Addr: a.cfg.MetricsAddr, Registry: a.cfg.Registry,
			Security: a.cfg.Transport, Authorizer: a.authz, Logger: a.log}, errc, metricsrv.FaultRoutes(a.cfg.Faults)...); err != nil {
			srv.Stop()
			return fmt.Errorf("agent: %w", err)
		}
		addrs.Metrics = metrics.Addr
	}
	defer a.peers.close()
	go a.fillWarm()
	go a.sweepPartials(ctx)
	vctx, stopVerifier := context.WithCancel(ctx)
	verifierDone := make(chan struct{})
	go func() { a.runVerifier(vctx); close(verifierDone) }()
	defer func() { stopVerifier(); <-verifierDone }()
	if a.rep != nil {
		rctx, stopRep := context.WithCancel(ctx)
		repDone, suspectsDone := make(chan struct{}), make(chan struct{})
		go func() { a.rep.run(rctx); close(repDone) }()
		go func() { a.rep.sendSuspects(rctx); close(suspectsDone) }()
		defer func() { stopRep(); <-repDone; <-suspectsDone }()
	}
	if a.tr != nil {
		tctx, stopTr := context.WithCancel(ctx)
		trDone := make(chan struct{})
		go func() { a.tr.run(tctx); close(trDone) }()
		defer func() { stopTr(); <-trDone }()
	}
	if a.cfg.Gossip != nil {
		leave, err := a.startMembership(ctx)
		if err != nil {
			srv.Stop()
			return err
		}
		defer leave()
	}
	a.log.Info("agent serving", "socket", addrs.Socket, "tcp", addrs.TCP, "metrics", addrs.Metrics)
	if ready != nil {
		ready(addrs)
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		srv.Stop()
	}
	metrics.Close()
	seg.Close()
	_ = os.Remove(a.cfg.Socket)
	a.log.Info("agent stopped")
	return err
}

// Addrs are where a running agent listens.
type Addrs struct {
	Socket, TCP, Metrics string
}

// socketDir makes sure the directory of the socket at path exists. A
// missing one is created (0755), as /run/rewind is under /run, but only
// that one directory: never its parents, and never a directory at the
// file system's root, so a mistyped --socket fails here, naming what is
// missing, instead of leaving new directories about the host.
func socketDir(path string) error {
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("agent: socket %s: %w", path, err)
	}
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("agent: socket %s: %s is not a directory", path, dir)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent == dir || parent == string(filepath.Separator) {
		return fmt.Errorf("agent: socket %s: directory %s does not exist, and the agent creates none at the file system's root; create it, or put the socket under an existing directory such as /run", path, dir)
	}
	if st, err := os.Stat(parent); err != nil || !st.IsDir() {
		return fmt.Errorf("agent: socket %s: directory %s does not exist, nor does its parent %s; the agent creates only the socket's own directory", path, dir, parent)
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("agent: socket directory: %w", err)
	}
	return nil
}

// listenUnix opens the SDK's gRPC socket.
func (a *Agent) listenUnix() (net.Listener, error) {
	if err := socketDir(a.cfg.Socket); err != nil {
		return nil, err
	}
	return a.listenSocket("unix", a.cfg.Socket)
}

// listenSocket opens a Unix socket of the SDK, owner-only (0600) or, with
// SocketGroup, group-writable (0660) and owned by that group. A stale
// socket left by a dead agent is replaced; a live one is an error.
func (a *Agent) listenSocket(network, path string) (net.Listener, error) {
	if _, err := os.Stat(path); err == nil {
		if c, err := net.DialTimeout(network, path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("agent: another agent is serving on %s", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("agent: removing stale socket: %w", err)
		}
	}
	l, err := net.Listen(network, path)
	if err != nil {
		return nil, fmt.Errorf("agent: listen %s: %w", path, err)
	}
	mode := os.FileMode(0o600)
	if g := a.cfg.SocketGroup; g != "" {
		gid, err := lookupGroup(g)
		if err != nil {
			l.Close()
			return nil, err
		}
		if err := os.Chown(path, -1, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("agent: chown socket to group %s: %w", g, err)
		}
		mode = 0o660
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("agent: chmod socket: %w", err)
	}
	return l, nil
}

func lookupGroup(name string) (int, error) {
	if gid, err := strconv.Atoi(name); err == nil {
		return gid, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("agent: socket group: %w", err)
	}
	return strconv.Atoi(g.Gid)
}

func isCorrupt(err error) bool { return errors.Is(err, shm.ErrCorrupt) }
