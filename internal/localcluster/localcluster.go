// Package localcluster runs a rewind cluster as processes on this
// machine: MinIO (when it is built), a coordinator and agents, each agent
// a node with its own shm root, Unix socket and loopback ports, and tiers
// under one temporary directory (each node its own NVMe directory, one
// shared parallel-filesystem directory). The demo and the goodput
// benchmark play their scenarios on it; what they add (certificates, a
// job key, fault injection) they pass as flags.
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/child"
	"rewind.dev/rewind/internal/freeport"
	"rewind.dev/rewind/internal/miniotest"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/transport"
)

// readyTimeout bounds a daemon's start: a coordinator or agent that does
// not answer within it has failed (its log says why).
const readyTimeout = 10 * time.Second

// Options configures a cluster.
type Options struct {
	Rewind string // the rewind binary
	Name   string // "demo", "goodput": prefixes its directories, its S3 tier's keys and its errors
	ShmDir string // where the nodes' shm roots are made (a tmpfs)
	MinIO  bool   // start MinIO when it is built (miniotest.Binary)
}

// Cluster is a running local cluster.
type Cluster struct {
	opts    Options
	Tmp     string            // logs, tiers, the coordinator's store
	ShmBase string            // the nodes' shm roots
	MinIO   *miniotest.Server // nil without the object store
	Addr    string            // the coordinator's gRPC address
	Gossip  string            // the coordinator's gossip address
	Coord   *child.Proc
	Conn    *grpc.ClientConn
	API     coordpb.CoordinatorClient
	Nodes   []*Node
	sec     *transport.Security // the caller's (StartCoordinator): dials the daemons
}

// Node is a node: its agent and what the agent was started with.
type Node struct {
	Name, Domain    string
	ShmRoot, Socket string
	Listen, Gossip  string
	Metrics         string // the metrics and fault-injection endpoint, "" for none
	Log             string // the agent's log, appended to on each start
	Agent           *child.Proc
}

// New makes the cluster's directories and starts MinIO; the caller then
// starts the coordinator and the nodes, and Closes the cluster, also
// when New fails.
func New(o Options) (*Cluster, error) {
	c := &Cluster{opts: o}
	var err error
	if c.Tmp, err = os.MkdirTemp("", "rewind-"+o.Name+"-"); err != nil {
		return c, c.errorf("%w", err)
	}
	if c.ShmBase, err = os.MkdirTemp(o.ShmDir, "rewind-"+o.Name+"-"); err != nil {
		return c, c.errorf("%w", err)
	}
	if _, berr := miniotest.Binary(); berr == nil && o.MinIO {
		if c.MinIO, err = miniotest.Launch(c.Tmp); err != nil {
			return c, c.errorf("starting MinIO: %w", err)
		}
	}
	return c, nil
}

func (c *Cluster) errorf(format string, args ...any) error {
	return fmt.Errorf(c.opts.Name+": "+format, args...)
}

// StartCoordinator starts the coordinator with the tier policy and more
// flags (its certificates), dials it as sec (nil: plaintext) and waits
// until it answers.
func (c *Cluster) StartCoordinator(ctx context.Context, policy string, sec *transport.Security, flags ...string) error {
	log := filepath.Join(c.Tmp, "coordinator.log")
	c.sec = sec
	pick := func() { c.Addr, c.Gossip = freeport.Pick(), freeport.Pick() }
	pick()
	return c.retryPorts(log, pick, func(from int64) error {
		args := []string{"coordinator", "--listen", c.Addr, "--data", filepath.Join(c.Tmp, "coordinator"), "--metrics", "",
			"--gossip", c.Gossip, "--replicas", "1", "--policy", policy}
		var err error
		if c.Coord, err = c.start(append(args, flags...), nil, log); err != nil {
			return err
		}
		if c.Conn != nil {
			c.Conn.Close()
		}
		if c.Conn, err = sec.NewClient(c.Addr, transport.ExpectCoordinator); err != nil {
			return c.errorf("%w", err)
		}
		c.API = coordpb.NewCoordinatorClient(c.Conn)
		err = c.Coord.Ready(ctx, readyTimeout, func() error {
			if err := logged(log, from, "coordinator serving"); err != nil {
				return err
			}
			_, err := c.API.ListJobs(ctx, &coordpb.ListJobsRequest{View: coordpb.JobView_JOB_VIEW_SUMMARY})
			return err
		})
		if err != nil {
			return c.errorf("the coordinator did not start: %w; its log is %s", err, log)
		}
		return nil
	})
}

// portAttempts bounds the starts of a daemon whose loopback port another
// process took between freeport's pick and the daemon's bind.
const portAttempts = 3

// retryPorts runs start, and again with fresh addresses from pick when
// the daemon exited because one of its ports was taken (its log, from
// this attempt on, says so). start is given where this attempt's lines
// begin in the log.
func (c *Cluster) retryPorts(log string, pick func(), start func(from int64) error) error {
	for attempt := 1; ; attempt++ {
		from := logSize(log)
		err := start(from)
		if err == nil || attempt == portAttempts || !errors.Is(err, child.ErrExited) || !portTaken(log, from) {
			return err
		}
		pick()
	}
}

// NewNode names a node that has not started: fresh loopback addresses, a
// metrics endpoint when metrics is set, its shm root and socket named for
// it. StartAgent starts it.
func (c *Cluster) NewNode(name, domain string, metrics bool) *Node {
	n := &Node{Name: name, Domain: domain, ShmRoot: filepath.Join(c.ShmBase, name), Socket: filepath.Join(c.Tmp, name+".sock"),
		Listen: freeport.Pick(), Gossip: freeport.Pick(), Log: filepath.Join(c.Tmp, name+".log")}
	if metrics {
		n.Metrics = freeport.Pick()
	}
	return n
}

// StartAgent starts n's agent (a node's first start, or a restart on the
// same shm root and addresses) with more flags and environment, and waits
// until its socket answers.
func (c *Cluster) StartAgent(ctx context.Context, n *Node, flags, env []string) error {
	if c.MinIO != nil {
		env = append([]string{"AWS_ACCESS_KEY_ID=" + c.MinIO.AccessKey, "AWS_SECRET_ACCESS_KEY=" + c.MinIO.SecretKey}, env...)
	}
	pick := func() {
		n.Listen, n.Gossip = freeport.Pick(), freeport.Pick()
		if n.Metrics != "" {
			n.Metrics = freeport.Pick()
		}
	}
	return c.retryPorts(n.Log, pick, func(from int64) error {
		args := append(c.agentArgs(n), flags...)
		var err error
		if n.Agent, err = c.start(args, env, n.Log); err != nil {
			return err
		}
		err = n.Agent.Ready(ctx, readyTimeout, func() error {
			if err := logged(n.Log, from, "agent serving"); err != nil {
				return err
			}
			cl, err := sdk.Dial(ctx, n.Socket)
			if err == nil {
				cl.Close()
			}
			return err
		})
		if err != nil {
			return c.errorf("agent %s did not start: %w; its log is %s", n.Name, err, n.Log)
		}
		return nil
	})
}

// agentArgs is the command line of n's agent, at its addresses now.
func (c *Cluster) agentArgs(n *Node) []string {
	args := []string{"agent", "--node", n.Name, "--failure-domain", n.Domain, "--shm-root", n.ShmRoot, "--socket", n.Socket,
		"--listen", n.Listen, "--advertise", n.Listen, "--metrics", n.Metrics, "--coordinator", c.Addr,
		"--gossip", n.Gossip, "--gossip-join", c.Gossip,
		"--tier", "nvme=file://" + filepath.Join(c.Tmp, "nvme-"+n.Name), "--tier", "pfs=file://" + filepath.Join(c.Tmp, "pfs")}
	if c.MinIO != nil {
		args = append(args, "--tier", "s3=s3://"+c.MinIO.Bucket+"/"+c.opts.Name, "--s3-endpoint", c.MinIO.URL())
	}
	return args
}

// logSize is the length of a daemon's log now (0 when it has none).
func logSize(log string) int64 {
	fi, err := os.Stat(log)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// portTaken reports whether the daemon's log, from offset from on, says
// it could not bind a port because another process holds it.
func portTaken(log string, from int64) bool {
	return logged(log, from, "address already in use") == nil
}

// logged returns nil once the daemon's log, from offset from on, has
// line in it: a daemon logs that it serves once every listener is bound
// (its gossip port last), so an answer on its address before then may
// be another process's, holding a port it was given.
func logged(log string, from int64, line string) error {
	f, err := os.Open(log)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, from, 4<<20))
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), line) {
		return fmt.Errorf("%s has not logged %q yet", log, line)
	}
	return nil
}

// start starts rewind with args and env added to this process's
// environment, its output appended to log.
func (c *Cluster) start(args, env []string, log string) (*child.Proc, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, c.errorf("%w", err)
	}
	defer f.Close() // the child has its own descriptor
	cmd := exec.Command(c.opts.Rewind, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	p, err := child.Start(cmd)
	if err != nil {
		return nil, c.errorf("%w", err)
	}
	return p, nil
}

// Faults arms spec on a node's agent (PUT /debug/faults: the agent runs
// with --fault-injection and a metrics endpoint); an empty spec disarms
// every fault (DELETE).
func (c *Cluster) Faults(ctx context.Context, n *Node, spec string) error {
	method := http.MethodPut
	if spec == "" {
		method = http.MethodDelete
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.sec.URL(n.Metrics, faultinject.HandlerPath), strings.NewReader(spec))
	if err != nil {
		return err
	}
	hc := c.sec.HTTPClient(transport.ExpectNode(n.Name))
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		return c.errorf("arming %q on %s: %w", spec, n.Name, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return c.errorf("arming %q on %s: %s", spec, n.Name, resp.Status)
	}
	return nil
}

// Close stops every agent (a paused one is resumed first, to let it
// stop) and the coordinator, stops MinIO and removes the shm roots and,
// unless keepLogs, the temporary directory. It returns the directories
// it removed.
func (c *Cluster) Close(keepLogs bool) (removed []string) {
	for _, n := range c.Nodes {
		if n.Agent != nil {
			n.Agent.Signal(syscall.SIGCONT)
			n.Agent.Stop(3 * time.Second)
		}
	}
	if c.Coord != nil {
		c.Coord.Stop(3 * time.Second)
	}
	if c.Conn != nil {
		c.Conn.Close()
	}
	if c.MinIO != nil {
		c.MinIO.Close()
	}
	dirs := []string{c.ShmBase}
	if !keepLogs {
		dirs = append(dirs, c.Tmp)
	}
	for _, dir := range dirs {
		if dir != "" && os.RemoveAll(dir) == nil {
			removed = append(removed, dir)
		}
	}
	return removed
}

// Binaries returns the two binaries of a local cluster: exe, whose
// demo-train command is a rank (rewind-dev; empty: this process's own
// executable), and rewind, whose agent and coordinator commands are the
// cluster (empty: the rewind binary in exe's directory, where make build
// puts both).
func Binaries(exe, rewind string) (string, string, error) {
	if exe == "" {
		e, err := os.Executable()
		if err != nil {
			return "", "", fmt.Errorf("finding the rewind-dev binary: %w", err)
		}
		exe = e
	}
	if rewind == "" {
		rewind = filepath.Join(filepath.Dir(exe), "rewind")
	}
	if _, err := os.Stat(rewind); err != nil {
		return "", "", fmt.Errorf("the rewind binary that runs the agents and the coordinator: %w (make build puts it beside rewind-dev)", err)
	}
	return exe, rewind, nil
}

// Socket is the SDK socket of the node named name, "" for none.
func (c *Cluster) Socket(name string) string {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n.Socket
		}
	}
	return ""
}
