package goodput

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/freeport"
	"rewind.dev/rewind/internal/miniotest"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/transport"
)

// cluster is the local cluster of one configuration's run: MinIO (when
// built), a coordinator process and agent processes, each a node with
// its own shm root, socket and ports, on loopback in plaintext.
type cluster struct {
	rewind  string
	tmp     string // logs, tiers, the coordinator's store, the baseline's shared directory
	shmBase string
	minio   *miniotest.Server
	coord   *proc
	addr    string // the coordinator's gRPC
	gossip  string // the coordinator's gossip
	conn    *grpc.ClientConn
	api     coordpb.CoordinatorClient
	nodes   []*node
	gen     int // replacement nodes started
}

// node is an agent process and what it was started with.
type node struct {
	name, domain, shmRoot, socket, listen, gossip, metrics string
	agent                                                  *proc
}

// policy is the cluster's tier policy.
func (c *cluster) policy() string { return tierPolicy(c.minio != nil) }

// tierPolicy is the tier policy: durable copies every few steps, on S3
// when there is an object store.
func tierPolicy(s3 bool) string {
	p := "nvme:every=5,keep=2;pfs:every=10,keep=2"
	if s3 {
		p += ";s3:every=30,keep=2"
	}
	return p
}

// startCluster starts MinIO, the coordinator and n agents under dirs made
// in tmpParent and shmParent.
func startCluster(ctx context.Context, rewind, shmParent string, n int, noMinIO bool) (_ *cluster, err error) {
	c := &cluster{rewind: rewind}
	defer func() {
		if err != nil {
			c.close(false)
		}
	}()
	if c.tmp, err = os.MkdirTemp("", "rewind-goodput-"); err != nil {
		return c, err
	}
	if c.shmBase, err = os.MkdirTemp(shmParent, "rewind-goodput-"); err != nil {
		return c, err
	}
	if _, berr := miniotest.Binary(); berr == nil && !noMinIO {
		if c.minio, err = miniotest.Launch(c.tmp); err != nil {
			return c, fmt.Errorf("goodput: starting MinIO: %w", err)
		}
	}
	if err := c.startCoordinator(ctx); err != nil {
		return c, err
	}
	for i := range n {
		nd := &node{name: fmt.Sprintf("node-%d", i), domain: fmt.Sprintf("rack-%c", 'a'+i%2)}
		if err := c.startAgent(ctx, nd, true); err != nil {
			return c, err
		}
		c.nodes = append(c.nodes, nd)
	}
	return c, nil
}

func (c *cluster) startCoordinator(ctx context.Context) error {
	c.addr, c.gossip = freeAddr(), freeAddr()
	log, err := os.Create(filepath.Join(c.tmp, "coordinator.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	args := []string{"coordinator", "--listen", c.addr, "--data", filepath.Join(c.tmp, "coordinator"), "--metrics", "",
		"--gossip", c.gossip, "--replicas", "1", "--policy", c.policy()}
	if c.coord, err = startProc(c.rewind, args, nil, log); err != nil {
		return err
	}
	var sec *transport.Security // plaintext on loopback
	if c.conn, err = sec.NewClient(c.addr, transport.ExpectCoordinator); err != nil {
		return err
	}
	c.api = coordpb.NewCoordinatorClient(c.conn)
	return waitUntil(ctx, 10*time.Second, func() error {
		if c.coord.exited() {
			return fmt.Errorf("goodput: the coordinator: %w (%v); its log is %s", errGone, c.coord.err, log.Name())
		}
		_, err := c.api.ListJobs(ctx, &coordpb.ListJobsRequest{})
		return err
	})
}

// startAgent starts a node's agent; fresh gives it new addresses and an
// empty shm root (a node's first start, a replacement), otherwise it
// restarts on its own (an agent crash).
func (c *cluster) startAgent(ctx context.Context, n *node, fresh bool) error {
	if fresh {
		n.shmRoot = filepath.Join(c.shmBase, n.name)
		n.socket = filepath.Join(c.tmp, n.name+".sock")
		n.listen, n.gossip, n.metrics = freeAddr(), freeAddr(), freeAddr()
	}
	args := []string{"agent", "--node", n.name, "--failure-domain", n.domain, "--shm-root", n.shmRoot, "--socket", n.socket,
		"--listen", n.listen, "--advertise", n.listen, "--metrics", n.metrics, "--coordinator", c.addr,
		"--gossip", n.gossip, "--gossip-join", c.gossip, "--fault-injection",
		"--tier", "nvme=file://" + filepath.Join(c.tmp, "nvme-"+n.name), "--tier", "pfs=file://" + filepath.Join(c.tmp, "pfs")}
	var env []string
	if c.minio != nil {
		args = append(args, "--tier", "s3=s3://"+c.minio.Bucket+"/goodput", "--s3-endpoint", c.minio.URL())
		env = []string{"AWS_ACCESS_KEY_ID=" + c.minio.AccessKey, "AWS_SECRET_ACCESS_KEY=" + c.minio.SecretKey}
	}
	log, err := os.OpenFile(filepath.Join(c.tmp, n.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	if n.agent, err = startProc(c.rewind, args, env, log); err != nil {
		return err
	}
	return waitUntil(ctx, 10*time.Second, func() error {
		if n.agent.exited() {
			return fmt.Errorf("goodput: agent %s: %w (%v); its log is %s", n.name, errGone, n.agent.err, log.Name())
		}
		cl, err := sdk.Dial(ctx, n.socket)
		if err == nil {
			cl.Close()
		}
		return err
	})
}

// replace starts a new node in place of the i-th (lost) one: a new name,
// new addresses, an empty shm root, the same failure domain.
func (c *cluster) replace(ctx context.Context, i int) (*node, error) {
	c.gen++
	old := c.nodes[i]
	n := &node{name: fmt.Sprintf("node-%d-r%d", i, c.gen), domain: old.domain}
	if err := c.startAgent(ctx, n, true); err != nil {
		return nil, err
	}
	c.nodes[i] = n
	return n, nil
}

// faults arms spec on a node's agent (PUT /debug/faults); an empty spec
// disarms every fault (DELETE).
func (c *cluster) faults(ctx context.Context, n *node, spec string) error {
	method := http.MethodPut
	if spec == "" {
		method = http.MethodDelete
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+n.metrics+"/debug/faults", strings.NewReader(spec))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("goodput: arming %q on %s: %w", spec, n.name, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("goodput: arming %q on %s: %s", spec, n.name, resp.Status)
	}
	return nil
}

// close stops every process and removes the directories (the temporary
// one stays with keep).
func (c *cluster) close(keep bool) {
	for _, n := range c.nodes {
		if n.agent != nil {
			n.agent.signal(syscall.SIGCONT) // a hung node's agent, to let it stop
			n.agent.stop(3 * time.Second)
		}
	}
	if c.coord != nil {
		c.coord.stop(3 * time.Second)
	}
	if c.conn != nil {
		c.conn.Close()
	}
	if c.minio != nil {
		c.minio.Close()
	}
	if c.shmBase != "" {
		os.RemoveAll(c.shmBase)
	}
	if c.tmp != "" && !keep {
		os.RemoveAll(c.tmp)
	}
}

// proc is a child process.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProc(exe string, args, env []string, log *os.File) (*proc, error) {
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = log, log, sysProcAttr()
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("goodput: starting %s %s: %w", filepath.Base(exe), args[0], err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) signal(sig syscall.Signal) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(sig)
	}
}

func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) stop(grace time.Duration) {
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.kill()
	}
}

// errGone marks an error of waitUntil's try that no retry can mend.
var errGone = errors.New("process exited")

// waitUntil calls try until it returns nil or an error wrapping errGone,
// ctx ends or limit passes.
func waitUntil(ctx context.Context, limit time.Duration, try func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := try()
		if err == nil || errors.Is(err, errGone) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("goodput: not ready within %v: %w", limit, err)
		}
		if err := clock.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

func freeAddr() string {
	a, err := freeport.Addr()
	if err != nil {
		return "127.0.0.1:0"
	}
	return a
}
