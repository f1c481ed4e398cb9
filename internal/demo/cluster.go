package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/localcluster"
	"rewind.dev/rewind/internal/miniotest"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/regang"
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
	// Elastic, when above 0, registers the job for elastic recovery with
	// this minimum world size and trains the elastic model (a global
	// state of Size × Ranks bytes sharded over the ranks): a node that
	// dies with no spare left shrinks the job, whose ranks reshard.
	Elastic int
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
	case c.Elastic < 0 || c.Elastic >= c.Ranks:
		return fmt.Errorf("demo: elastic minimum world size %d: want 1 to %d, below the %d ranks (0: off)", c.Elastic, c.Ranks-1, c.Ranks)
	case c.KillMin < 2 || c.KillMax < c.KillMin || c.Steps < int64(c.Kills)*(c.KillMax+1)+4:
		return fmt.Errorf("demo: %d kills in [%d, %d] steps apart need more than %d steps", c.Kills, c.KillMin, c.KillMax, c.Steps)
	}
	return nil
}

// cluster is one run of the cluster demo.
type cluster struct {
	cfg    ClusterConfig
	exe    string // rewind-dev: the ranks
	rewind string // rewind: the coordinator and the agents
	tl     *timeline
	rng    *rand.Rand
	lc     *localcluster.Cluster

	certs            string              // the certificates' directory ("" with Plaintext)
	sec              *transport.Security // the demo's own, an operator's
	jobKey, jobToken string              // the agents' job key file; the job's token, its ranks'
	api              coordpb.CoordinatorClient
	driver           *regang.Local

	mu     sync.Mutex
	ranks  map[uint32]*rankOut // the current process of each rank
	events chan *coordpb.JobEvent
	checks []Check
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
	if cfg.Elastic > 0 {
		d.tl.plain("elastic: the ranks hold rows of one model; with no spare node, the job shrinks (to at least %d ranks) and every rank reshards.\n", cfg.Elastic)
	}
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
	if d.exe, d.rewind, err = localcluster.Binaries(d.cfg.Exe, d.cfg.Rewind); err != nil {
		return fmt.Errorf("demo: %w", err)
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
	d.lc, err = localcluster.New(localcluster.Options{Rewind: d.rewind, Name: "demo", ShmDir: d.cfg.ShmDir, MinIO: !d.cfg.NoMinIO})
	if err != nil {
		return err
	}
	switch _, berr := miniotest.Binary(); {
	case d.lc.MinIO != nil:
		d.tl.log("minio", "object store on %s (bucket %s)", d.lc.MinIO.URL(), d.lc.MinIO.Bucket)
	case !d.cfg.NoMinIO && berr != nil:
		d.tl.log("minio", "not built (`make minio`): the demo runs without the object-store tier")
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
	if d.lc.MinIO != nil {
		p += ";s3:every=10,keep=2"
	}
	return p
}

func (d *cluster) startCoordinator(ctx context.Context) error {
	if err := d.lc.StartCoordinator(ctx, d.policy(), d.sec, d.tlsArgs("coordinator")...); err != nil {
		return err
	}
	d.api = d.lc.API
	d.tl.log("coord", "coordinator pid %d on %s, failure detection on %s, policy %s", d.lc.Coord.Pid(), d.lc.Addr, d.lc.Gossip, d.policy())
	return nil
}

func (d *cluster) startAgent(ctx context.Context, i int) error {
	n := d.lc.NewNode(nodeName(i), fmt.Sprintf("rack-%c", 'a'+i%2), false)
	d.lc.Nodes = append(d.lc.Nodes, n)
	flags := append([]string{"--job-key", d.jobKey}, d.tlsArgs(filepath.Join("node", n.Name))...)
	var env []string
	if d.cfg.Faults != "" {
		flags = append(flags, "--fault-injection")
		env = []string{"REWIND_FAULTS=" + d.cfg.Faults, fmt.Sprintf("REWIND_FAULT_SEED=%d", d.cfg.Seed+uint64(i))}
	}
	if err := d.lc.StartAgent(ctx, n, flags, env); err != nil {
		return err
	}
	d.tl.log(n.Name, "agent pid %d, %s, shm %s", n.Agent.Pid(), n.Domain, n.ShmRoot)
	return nil
}

// cleanup stops everything and removes every directory (but the logs
// with KeepLogs).
func (d *cluster) cleanup() {
	if d.driver != nil {
		d.driver.KillAll()
	}
	if d.lc == nil {
		return
	}
	if d.cfg.KeepLogs {
		d.tl.log("demo", "logs kept in %s", d.lc.Tmp)
	}
	removed := d.lc.Close(d.cfg.KeepLogs)
	d.tl.log("demo", "stopped every process, removed %s", strings.Join(removed, " and "))
}
