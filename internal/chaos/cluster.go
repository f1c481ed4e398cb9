package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/faultinject"
	"rewind.dev/rewind/internal/metricsrv"
	"rewind.dev/rewind/transport"
)

// The compose services (deploy/compose/docker-compose.yml).
const (
	svcCoordinator = "coordinator"
	svcMinIO       = "minio"
)

// nodeServices are the node containers, each named as its node.
var nodeServices = []string{"node1", "node2", "node3", "node4"}

// hostOctet is each service's last address byte on the cluster's /24
// (the compose file gives them fixed addresses, so that a node
// reconnected after a partition comes back where its peers knew it).
var hostOctet = map[string]int{svcCoordinator: 10, svcMinIO: 11, "node1": 21, "node2": 22, "node3": 23, "node4": 24}

// Cluster is the compose cluster, driven through the docker-compose and
// docker command lines. Every command runs under a timeout.
type Cluster struct {
	File    string // the compose file
	Project string // the compose project name
	Net     string // the first three bytes of the cluster's /24, "172.31.240"
	Ports   Ports
	// The job's settings the compose file takes from the environment.
	Job, Size string
	StepTime  time.Duration

	// Certs is the cluster's certificate directory (makeCerts), mounted
	// into every container as /certs.
	Certs string
	sec   *transport.Security // the runner's, an operator's

	httpMu sync.Mutex
	https  map[string]*http.Client // service -> client of its metrics port

	ids  map[string]string // service -> container id
	conn *grpc.ClientConn
	API  coordpb.CoordinatorClient
}

// Ports are the host ports (on 127.0.0.1) the compose file publishes.
type Ports struct {
	Coord        int            // the coordinator's gRPC
	CoordMetrics int            // the coordinator's /metrics and /debug/faults
	Nodes        map[string]int // each node's /metrics and /debug/faults
}

// env is the environment docker-compose substitutes into the file.
func (c *Cluster) env() []string {
	e := append(os.Environ(),
		"CHAOS_NET="+c.Net,
		"CHAOS_JOB="+c.Job,
		"CHAOS_SIZE="+c.Size,
		"CHAOS_STEP_TIME="+c.StepTime.String(),
		"CHAOS_COORD_PORT="+strconv.Itoa(c.Ports.Coord),
		"CHAOS_COORD_METRICS_PORT="+strconv.Itoa(c.Ports.CoordMetrics),
		"CHAOS_CERTS="+c.Certs)
	for i, n := range nodeServices {
		e = append(e, fmt.Sprintf("CHAOS_NODE%d_METRICS_PORT=%d", i+1, c.Ports.Nodes[n]))
	}
	return e
}

// run runs a command line under timeout and returns its standard output;
// its error carries the standard error.
func run(ctx context.Context, timeout time.Duration, env []string, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 600 {
			msg = "..." + msg[len(msg)-600:]
		}
		if ctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("timed out after %v", timeout)
		}
		return stdout.Bytes(), fmt.Errorf("chaos: %s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}

func (c *Cluster) compose(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	return run(ctx, timeout, c.env(), "docker-compose", append([]string{"-f", c.File, "-p", c.Project}, args...)...)
}

func (c *Cluster) docker(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	return run(ctx, timeout, nil, "docker", args...)
}

// id returns a service's container id.
func (c *Cluster) id(svc string) string {
	if id := c.ids[svc]; id != "" {
		return id
	}
	return c.Project + "_" + svc + "_1" // docker-compose v1's name, before ids are known
}

// network is the compose network's name (docker-compose v1: project_name).
func (c *Cluster) network() string { return c.Project + "_rewind" }

// addr returns a service's address on the cluster network.
func (c *Cluster) addr(svc string) string { return fmt.Sprintf("%s.%d", c.Net, hostOctet[svc]) }

// Kill sends SIGKILL to a service's container.
func (c *Cluster) Kill(ctx context.Context, svc string) error {
	_, err := c.docker(ctx, 30*time.Second, "kill", c.id(svc))
	return err
}

// Start starts a stopped container again.
func (c *Cluster) Start(ctx context.Context, svc string) error {
	_, err := c.docker(ctx, 60*time.Second, "start", c.id(svc))
	return err
}

// Pause freezes every process of a container (a hung node); Unpause
// thaws them.
func (c *Cluster) Pause(ctx context.Context, svc string) error {
	_, err := c.docker(ctx, 30*time.Second, "pause", c.id(svc))
	return err
}

func (c *Cluster) Unpause(ctx context.Context, svc string) error {
	_, err := c.docker(ctx, 30*time.Second, "unpause", c.id(svc))
	return err
}

// Disconnect cuts a container off the cluster network (a partition);
// Connect puts it back at its address and name.
func (c *Cluster) Disconnect(ctx context.Context, svc string) error {
	_, err := c.docker(ctx, 30*time.Second, "network", "disconnect", "--force", c.network(), c.id(svc))
	return err
}

func (c *Cluster) Connect(ctx context.Context, svc string) error {
	_, err := c.docker(ctx, 30*time.Second, "network", "connect", "--ip", c.addr(svc), "--alias", svc, c.network(), c.id(svc))
	return err
}

// Exec runs a command in a running container (the images have no shell:
// args[0] is a binary of the image, /rewind).
func (c *Cluster) Exec(ctx context.Context, svc string, args ...string) ([]byte, error) {
	return c.docker(ctx, 60*time.Second, append([]string{"exec", c.id(svc)}, args...)...)
}

// Running reports whether a container is running, and when it last
// stopped with which exit status.
func (c *Cluster) Running(ctx context.Context, svc string) (running bool, finished time.Time, code int, err error) {
	out, err := c.docker(ctx, 20*time.Second, "inspect", "-f", "{{.State.Running}} {{.State.FinishedAt}} {{.State.ExitCode}}", c.id(svc))
	if err != nil {
		return false, time.Time{}, 0, err
	}
	f := strings.Fields(string(out))
	if len(f) != 3 {
		return false, time.Time{}, 0, fmt.Errorf("chaos: docker inspect %s: %q", svc, out)
	}
	finished, _ = time.Parse(time.RFC3339Nano, f[1])
	code, _ = strconv.Atoi(f[2])
	return f[0] == "true", finished, code, nil
}

// Logs returns a container's standard output and standard error, with
// docker's timestamps.
func (c *Cluster) Logs(ctx context.Context, svc string) (stdout, stderr []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", "logs", "--timestamps", c.id(svc))
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		return nil, nil, fmt.Errorf("chaos: docker logs %s: %w", svc, err)
	}
	return o.Bytes(), e.Bytes(), nil
}

// SaveLogs writes every service's logs (standard output and error, with
// docker's timestamps) to dir/SERVICE.log.
func (c *Cluster) SaveLogs(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, svc := range append([]string{svcCoordinator, svcMinIO}, nodeServices...) {
		stdout, stderr, err := c.Logs(ctx, svc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, svc+".log"), append(stdout, stderr...), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Faults arms a fault spec on a daemon (PUT /debug/faults on its metrics
// port); an empty spec disarms everything.
func (c *Cluster) Faults(ctx context.Context, svc, spec string) error {
	method := http.MethodPut
	if spec == "" {
		method = http.MethodDelete
	}
	return c.httpDo(ctx, method, svc, spec, nil)
}

// FaultHits returns how often a daemon's fault point fired.
func (c *Cluster) FaultHits(ctx context.Context, svc, point string) (uint64, error) {
	var body bytes.Buffer
	if err := c.httpDo(ctx, http.MethodGet, svc, "", &body); err != nil {
		return 0, err
	}
	return parseHits(body.Bytes(), point)
}

// metricsPort is the published port of a daemon's metrics address,
// where its debug endpoints are served.
func (c *Cluster) metricsPort(svc string) int {
	if svc == svcCoordinator {
		return c.Ports.CoordMetrics
	}
	return c.Ports.Nodes[svc]
}

// Goroutines returns a running daemon's goroutines' stacks (its
// metrics port's debug endpoint, served with fault injection on).
func (c *Cluster) Goroutines(ctx context.Context, svc string) ([]byte, error) {
	var body bytes.Buffer
	err := c.httpPath(ctx, http.MethodGet, svc, metricsrv.GoroutinesPath, "", &body)
	return body.Bytes(), err
}

func (c *Cluster) httpDo(ctx context.Context, method, svc, body string, out io.Writer) error {
	return c.httpPath(ctx, method, svc, faultinject.HandlerPath, body, out)
}

// httpClient is the client of svc's metrics port: mutual TLS as the
// runner (an operator: the debug endpoints are operators'), svc's
// certificate checked.
func (c *Cluster) httpClient(svc string) *http.Client {
	c.httpMu.Lock()
	defer c.httpMu.Unlock()
	if hc := c.https[svc]; hc != nil {
		return hc
	}
	expect := transport.ExpectNode(svc)
	if svc == svcCoordinator {
		expect = transport.ExpectCoordinator
	}
	if c.https == nil {
		c.https = map[string]*http.Client{}
	}
	c.https[svc] = c.sec.HTTPClient(expect)
	return c.https[svc]
}

// httpPath calls path on svc's metrics port.
func (c *Cluster) httpPath(ctx context.Context, method, svc, path, body string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	url := c.sec.URL(net.JoinHostPort("127.0.0.1", strconv.Itoa(c.metricsPort(svc))), path)
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := c.httpClient(svc).Do(req)
	if err != nil {
		return fmt.Errorf("chaos: %s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("chaos: %s %s %q: %s: %s", method, url, body, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		_, _ = out.Write(b)
	}
	return nil
}

// dial connects to the coordinator's published gRPC port.
func (c *Cluster) dial() error {
	conn, err := c.sec.NewClient(net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Ports.Coord)), transport.ExpectCoordinator,
		// The coordinator restarts in some scenarios: reconnect within a
		// second of its return, not after grpc's minutes of backoff. An
		// attempt gets 5 s to connect (without MinConnectTimeout it gets
		// only the backoff's delay, which a TLS handshake under load
		// outlasts).
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second}))
	if err != nil {
		return err
	}
	c.conn, c.API = conn, coordpb.NewCoordinatorClient(conn)
	return nil
}

// Close drops the coordinator connection.
func (c *Cluster) Close() {
	if c.conn != nil {
		c.conn.Close()
		c.conn, c.API = nil, nil
	}
}
