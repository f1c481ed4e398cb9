package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/freeport"
	"rewind.dev/rewind/internal/miniotest"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/regang"
	"rewind.dev/rewind/sdk"
	"rewind.dev/rewind/transport"
	"rewind.dev/rewind/vfs"
)

// ClusterConfig configures the cluster demo: a coordinator, Nodes agents
// (separate processes, shm roots and ports, two failure domains), local
// directories as NVMe and parallel-filesystem tiers, MinIO when its binary
// is built, and a job of Ranks ranks saving every step; one node is killed
// (its agent, its ranks, its shared memory) and the job recovers.
type ClusterConfig struct {
	Exe      string // the rewind-dev binary the ranks run (demo-train); empty: this process's
	Rewind   string // the rewind binary the coordinator and agents run; empty: rewind in Exe's directory
	Nodes    int
	Ranks    int
	Steps    int64
	Size     int64 // bytes of state per rank
	StepTime time.Duration
	Seed     uint64
	// Kills nodes die, one after the other: each once the job's latest
	// consistent step is a random number of steps in [KillMin, KillMax]
	// past the step it last resumed from.
	Kills            int
	KillMin, KillMax int64
	ShmDir           string
	NoMinIO          bool // leave the object store out even when built
	KeepLogs         bool // leave the coordinator's and agents' logs (and tier directories) behind
	Plaintext        bool // no TLS: plaintext TCP on loopback (the default is mutual TLS, certificates made for the run)
	// Faults, when set, is a faultinject spec armed in every agent
	// (started with --fault-injection; each seeded from Seed): the
	// randomized tests' metamorphic mode.
	Faults string
	Out    io.Writer
}

// DefaultClusterConfig returns what `make demo` runs.
func DefaultClusterConfig() ClusterConfig {
	return ClusterConfig{Nodes: 4, Ranks: 4, Steps: 40, Size: 16 << 20, StepTime: 100 * time.Millisecond,
		Kills: 1, KillMin: 12, KillMax: 20, ShmDir: "/dev/shm", Out: os.Stdout}
}

func (c ClusterConfig) validate() error {
	switch {
	case c.Nodes < 3:
		return fmt.Errorf("demo: %d nodes: the cluster demo needs at least 3 (a node dies, a majority lives)", c.Nodes)
	case c.Ranks < 2:
		return fmt.Errorf("demo: %d ranks: want at least 2", c.Ranks)
	case c.Size < MinSize:
		return fmt.Errorf("demo: size %d bytes: want at least %d", c.Size, MinSize)
	case c.Kills < 1 || c.Kills > c.Nodes-2:
		return fmt.Errorf("demo: %d kills of %d nodes: want 1 to %d (a majority lives, and node-0)", c.Kills, c.Nodes, c.Nodes-2)
	case c.KillMin < 2 || c.KillMax < c.KillMin || c.Steps < int64(c.Kills)*(c.KillMax+1)+4:
		return fmt.Errorf("demo: %d kills in [%d, %d] steps apart need more than %d steps", c.Kills, c.KillMin, c.KillMax, c.Steps)
	}
	return nil
}

// cluster is one run of the cluster demo.
type cluster struct {
	cfg     ClusterConfig
	exe     string // rewind-dev: the ranks
	rewind  string // rewind: the coordinator and the agents
	tl      *timeline
	rng     *rand.Rand
	tmp     string
	shmBase string
	minio   *miniotest.Server

	coordAddr, gossip string
	certs             string              // the certificates' directory ("" with Plaintext)
	sec               *transport.Security // the demo's own, an operator's
	jobKey, jobToken  string              // the agents' job key file; the job's token, its ranks'
	coord             *proc
	nodes             []*node
	api               coordpb.CoordinatorClient
	conn              *grpc.ClientConn
	driver            *regang.Local

	mu     sync.Mutex
	ranks  map[uint32]*rankOut // the current process of each rank
	events chan *coordpb.JobEvent
	checks []Check
}

type node struct {
	name, domain, shmRoot, socket, listen, gossip string
	agent                                         *proc
}

// rankOut is what a rank's current process reported.
type rankOut struct {
	node   string
	out    *lineBuf
	start  Event // fresh or resumed
	last   Event // the latest saved or done
	events []Event
}

// RunCluster runs the cluster demo.
func RunCluster(ctx context.Context, cfg ClusterConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	d := &cluster{cfg: cfg, tl: newTimeline(cfg.Out), ranks: map[uint32]*rankOut{}, events: make(chan *coordpb.JobEvent, 4)}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()>>1 | 1
		d.cfg.Seed = cfg.Seed
	}
	d.rng = rand.New(rand.NewPCG(cfg.Seed, 0x636c7573746572)) // "cluster"
	d.tl.plain("rewind-dev demo: seed %d (replay with --seed %d)", cfg.Seed, cfg.Seed)
	d.tl.plain("a coordinator and %d nodes on this machine; a job of %d ranks saves %s per rank every step for %d steps;\none node dies (agent, ranks and shared memory), the job recovers and is checked bit for bit.\n",
		cfg.Nodes, cfg.Ranks, units.Bytes(uint64(cfg.Size)), cfg.Steps)
	err := d.setup(ctx)
	if err == nil {
		err = d.play(ctx)
	}
	d.cleanup()
	if errors.Is(err, context.Canceled) {
		return err
	}
	if err != nil {
		d.checks = append(d.checks, Check{Name: "the demo runs to the end", Detail: err.Error()})
	}
	failed := 0
	d.tl.plain("\nchecks:")
	for _, c := range d.checks {
		if !c.OK {
			failed++
		}
		d.tl.plain("  %s %s: %s", c.mark(), c.Name, c.Detail)
	}
	if failed > 0 {
		return fmt.Errorf("demo: %d of %d checks failed", failed, len(d.checks))
	}
	d.tl.plain("\nall %d checks passed.", len(d.checks))
	return nil
}

func (d *cluster) check(c Check) {
	d.checks = append(d.checks, c)
	d.tl.log("check", "%s %s: %s", c.mark(), c.Name, c.Detail)
}

// setup makes the directories and starts MinIO, the coordinator and the
// agents.
func (d *cluster) setup(ctx context.Context) error {
	var err error
	if d.exe, d.rewind, err = binaries(d.cfg.Exe, d.cfg.Rewind); err != nil {
		return err
	}
	st, err := vfs.Default.Statfs(d.cfg.ShmDir)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	// Per rank: three segments on its node, a replica's two on a peer,
	// the restored copy; and room for the agents' records.
	if need := uint64(d.cfg.Ranks)*6*uint64(d.cfg.Size) + 64<<20; st.Free < need {
		return fmt.Errorf("demo: %s has %s free, the cluster demo needs %s: pass a smaller --size", d.cfg.ShmDir, units.Bytes(st.Free), units.Bytes(need))
	}
	if d.tmp, err = os.MkdirTemp("", "rewind-demo-"); err != nil {
		return err
	}
	if d.shmBase, err = os.MkdirTemp(d.cfg.ShmDir, "rewind-demo-"); err != nil {
		return err
	}
	if !d.cfg.NoMinIO {
		if _, berr := miniotest.Binary(); berr == nil {
			if d.minio, err = miniotest.Launch(d.tmp); err != nil {
				return fmt.Errorf("demo: starting MinIO: %w", err)
			}
			d.tl.log("minio", "object store on %s (bucket %s)", d.minio.URL(), d.minio.Bucket)
		} else {
			d.tl.log("minio", "not built (`make minio`): the demo runs without the object-store tier")
		}
	}
	if err := d.makeCerts(); err != nil {
		return err
	}
	if err := d.makeJobKey(); err != nil {
		return err
	}
	if err := d.startCoordinator(ctx); err != nil {
		return err
	}
	for i := range d.cfg.Nodes {
		if err := d.startAgent(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// policy is the demo's tier policy: often, so that copies show within
// its forty steps.
func (d *cluster) policy() string {
	p := "nvme:every=5,keep=2;pfs:every=10,keep=2"
	if d.minio != nil {
		p += ";s3:every=10,keep=2"
	}
	return p
}

func (d *cluster) startCoordinator(ctx context.Context) error {
	d.coordAddr, d.gossip = freeAddr(), freeAddr()
	log, err := os.Create(filepath.Join(d.tmp, "coordinator.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	args := []string{"coordinator", "--listen", d.coordAddr, "--data", filepath.Join(d.tmp, "coordinator"), "--metrics", "",
		"--gossip", d.gossip, "--replicas", "1", "--policy", d.policy()}
	args = append(args, d.tlsArgs("coordinator")...)
	if d.coord, err = startProc("coord", d.rewind, args, log, log); err != nil {
		return err
	}
	d.conn, err = d.sec.NewClient(d.coordAddr, transport.ExpectCoordinator)
	if err != nil {
		return err
	}
	d.api = coordpb.NewCoordinatorClient(d.conn)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err = d.api.ListJobs(ctx, &coordpb.ListJobsRequest{}); err == nil {
			break
		}
		if d.coord.exited() || time.Now().After(deadline) {
			return fmt.Errorf("demo: the coordinator did not start (%v); its log is %s", err, log.Name())
		}
		if err := clock.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	d.tl.log("coord", "coordinator pid %d on %s, failure detection on %s, policy %s", d.coord.pid(), d.coordAddr, d.gossip, d.policy())
	return nil
}

func (d *cluster) startAgent(ctx context.Context, i int) error {
	n := &node{name: nodeName(i), domain: fmt.Sprintf("rack-%c", 'a'+i%2),
		shmRoot: filepath.Join(d.shmBase, fmt.Sprintf("node-%d", i)), socket: filepath.Join(d.tmp, fmt.Sprintf("node-%d.sock", i)),
		listen: freeAddr(), gossip: freeAddr()}
	args := []string{"agent", "--node", n.name, "--failure-domain", n.domain, "--shm-root", n.shmRoot, "--socket", n.socket,
		"--listen", n.listen, "--advertise", n.listen, "--metrics", "", "--coordinator", d.coordAddr,
		"--gossip", n.gossip, "--gossip-join", d.gossip, "--job-key", d.jobKey,
		"--tier", "nvme=file://" + filepath.Join(d.tmp, "nvme-"+n.name), "--tier", "pfs=file://" + filepath.Join(d.tmp, "pfs")}
	args = append(args, d.tlsArgs(filepath.Join("node", n.name))...)
	if d.minio != nil {
		args = append(args, "--tier", "s3=s3://"+d.minio.Bucket+"/demo", "--s3-endpoint", d.minio.URL())
	}
	log, err := os.Create(filepath.Join(d.tmp, n.name+".log"))
	if err != nil {
		return err
	}
	defer log.Close()
	if d.cfg.Faults != "" {
		args = append(args, "--fault-injection")
	}
	cmd := exec.Command(d.rewind, args...)
	cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = log, log, sysProcAttr()
	cmd.Env = os.Environ()
	if d.minio != nil {
		cmd.Env = append(cmd.Env, "AWS_ACCESS_KEY_ID="+d.minio.AccessKey, "AWS_SECRET_ACCESS_KEY="+d.minio.SecretKey)
	}
	if d.cfg.Faults != "" {
		cmd.Env = append(cmd.Env, "REWIND_FAULTS="+d.cfg.Faults, fmt.Sprintf("REWIND_FAULT_SEED=%d", d.cfg.Seed+uint64(len(d.nodes))))
	}
	if n.agent, err = startCmd(n.name, cmd); err != nil {
		return err
	}
	d.nodes = append(d.nodes, n)
	for deadline := time.Now().Add(agentReadyTimeout); ; {
		c, err := sdk.Dial(ctx, n.socket)
		if err == nil {
			c.Close()
			break
		}
		if n.agent.exited() || time.Now().After(deadline) {
			return fmt.Errorf("demo: agent %s did not start (%v); its log is %s", n.name, err, log.Name())
		}
		if err := clock.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	d.tl.log(n.name, "agent pid %d, %s, shm %s", n.agent.pid(), n.domain, n.shmRoot)
	return nil
}

// cleanup stops everything and removes every directory.
func (d *cluster) cleanup() {
	if d.driver != nil {
		d.driver.KillAll()
	}
	for _, n := range d.nodes {
		if n.agent != nil {
			n.agent.stop(3 * time.Second)
		}
	}
	if d.coord != nil {
		d.coord.stop(3 * time.Second)
	}
	if d.conn != nil {
		d.conn.Close()
	}
	if d.minio != nil {
		d.minio.Close()
	}
	var removed []string
	dirs := []string{d.shmBase, d.tmp}
	if d.cfg.KeepLogs {
		d.tl.log("demo", "logs kept in %s", d.tmp)
		dirs = dirs[:1]
	}
	for _, dir := range dirs {
		if dir != "" && os.RemoveAll(dir) == nil {
			removed = append(removed, dir)
		}
	}
	d.tl.log("demo", "stopped every process, removed %s", strings.Join(removed, " and "))
}

// freeAddr returns a loopback address with a free port, or one that lets
// the listener pick (127.0.0.1:0) when none is found.
func freeAddr() string {
	a, err := freeport.Addr()
	if err != nil {
		return "127.0.0.1:0"
	}
	return a
}
