package goodput

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/localcluster"
)

// FaultKind is a kind of fault the schedule injects.
type FaultKind string

// The kinds of fault.
const (
	// FaultNodeKill: SIGKILL a node's agent and ranks, wipe its shared
	// memory; a replacement node joins once the job has recovered.
	FaultNodeKill FaultKind = "node-kill"
	// FaultHang: SIGSTOP a node's agent and ranks (a hung node); SIGCONT
	// once the job has recovered without it.
	FaultHang FaultKind = "hang"
	// FaultPartition: the node's gossip is cut (faultinject gossip/send
	// drop: the node is heard by no one); healed once the job recovered.
	FaultPartition FaultKind = "partition"
	// FaultAgentCrash: SIGKILL a node's agent alone and restart it on
	// the same shared memory at once; its ranks live on.
	FaultAgentCrash FaultKind = "agent-crash"
	// FaultMinIODown: the object store killed, started again after
	// Config.MinIODown.
	FaultMinIODown FaultKind = "minio-down"
)

// AllFaults lists every kind, in the order a schedule's cycle starts from.
var AllFaults = []FaultKind{FaultNodeKill, FaultHang, FaultPartition, FaultAgentCrash, FaultMinIODown}

// ParseFaults parses a comma-separated list of kinds.
func ParseFaults(s string) ([]FaultKind, error) {
	var out []FaultKind
	for _, f := range strings.Split(s, ",") {
		k := FaultKind(strings.TrimSpace(f))
		if !slices.Contains(AllFaults, k) {
			return nil, fmt.Errorf("goodput: no fault kind %q (kinds: %v)", k, AllFaults)
		}
		out = append(out, k)
	}
	return out, nil
}

// Fault is a fault as injected.
type Fault struct {
	Kind   FaultKind
	Node   string
	At     time.Time
	Healed time.Time
	Err    string // what failed while injecting or healing it
}

// planned is a fault of the schedule.
type planned struct {
	at     time.Duration // from the run's start
	kind   FaultKind
	victim int // index into the nodes running ranks, modulo their number
}

// schedule draws the faults of a run of cfg.Duration: the k-th at
// (k + 0.5 ± 0.25) fault intervals, the kinds a seeded shuffle of kinds
// repeated, so every kind comes once before any comes twice. Both
// configurations get the same schedule.
func schedule(cfg Config, kinds []FaultKind) []planned {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x676f6f64707574)) // "goodput"
	var out []planned
	var cycle []FaultKind
	for k := 0; ; k++ {
		at := time.Duration((float64(k) + 0.25 + rng.Float64()/2) * float64(cfg.FaultEvery))
		if at >= cfg.Duration {
			return out
		}
		if len(cycle) == 0 {
			cycle = slices.Clone(kinds)
			rng.Shuffle(len(cycle), func(i, j int) { cycle[i], cycle[j] = cycle[j], cycle[i] })
		}
		out = append(out, planned{at: at, kind: cycle[0], victim: rng.IntN(1 << 20)})
		cycle = cycle[1:]
	}
}

// inject injects a planned fault and, for one that loses a node, waits
// for the job's recovery (at most HealAfter) and heals it.
func (r *runner) inject(ctx context.Context, pf planned) {
	n, idx := r.victim(pf.victim)
	f := &Fault{Kind: pf.kind, Node: n.Name}
	if pf.kind == FaultMinIODown {
		f.Node = "minio"
	}
	r.drainRecoveries()
	var err error
	f.At = wallNow()
	switch pf.kind {
	case FaultNodeKill:
		n.Agent.Kill()
		r.driver.KillNode(n.Name)
		err = os.RemoveAll(n.ShmRoot)
	case FaultHang:
		n.Agent.Signal(syscall.SIGSTOP)
		r.signalRanks(n.Name, syscall.SIGSTOP)
	case FaultPartition:
		err = r.cl.Faults(ctx, n, "gossip/send=drop")
	case FaultAgentCrash:
		n.Agent.Kill()
		err = r.cl.StartAgent(ctx, n, agentFlags, nil)
	case FaultMinIODown:
		err = r.cl.MinIO.Kill()
	}
	r.addFault(f)
	r.log("fault: %s %s", f.Kind, f.Node)
	if err != nil {
		r.faultErr(f, err)
	}
	switch pf.kind {
	case FaultNodeKill, FaultHang, FaultPartition:
		r.waitRecovery(ctx, r.cfg.HealAfter)
	case FaultMinIODown:
		_ = clock.Sleep(ctx, r.cfg.MinIODown)
	default:
		return
	}
	switch pf.kind {
	case FaultNodeKill:
		_, err = r.cl.replace(ctx, idx)
	case FaultHang:
		r.signalRanks(n.Name, syscall.SIGCONT)
		n.Agent.Signal(syscall.SIGCONT)
	case FaultPartition:
		err = r.cl.Faults(ctx, n, "")
	case FaultMinIODown:
		err = r.cl.MinIO.Start()
	}
	r.mu.Lock()
	f.Healed = wallNow()
	r.mu.Unlock()
	if err != nil {
		r.faultErr(f, err)
	}
	r.log("healed: %s %s", f.Kind, f.Node)
}

// victim returns the node a fault hits: of the nodes running a rank (in
// name order), the one at v modulo their number, and its index among
// all nodes.
func (r *runner) victim(v int) (*localcluster.Node, int) {
	r.mu.Lock()
	var names []string
	for _, lr := range r.live {
		if !slices.Contains(names, lr.node) {
			names = append(names, lr.node)
		}
	}
	r.mu.Unlock()
	slices.Sort(names)
	for len(names) > 0 {
		want := names[v%len(names)]
		for i, n := range r.cl.Nodes {
			if n.Name == want {
				return n, i
			}
		}
		names = slices.Delete(names, v%len(names), v%len(names)+1)
	}
	i := v % len(r.cl.Nodes)
	return r.cl.Nodes[i], i
}

// signalRanks signals the processes of the ranks now on node.
func (r *runner) signalRanks(node string, sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, lr := range r.live {
		if lr.node == node && lr.cmd.Process != nil {
			_ = lr.cmd.Process.Signal(sig)
		}
	}
}

func (r *runner) faultErr(f *Fault, err error) {
	r.mu.Lock()
	f.Err = strings.TrimSpace(f.Err + " " + err.Error())
	r.mu.Unlock()
	r.log("fault %s %s: %v", f.Kind, f.Node, err)
}
