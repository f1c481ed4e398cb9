package kubetest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// mpirun is the harness's stand-in for Open MPI's mpirun in a launcher
// pod: it reads the hostfile mpi-operator wrote (the NAME-config
// ConfigMap: "HOST slots=N" per worker, in rank order), starts slots
// ranks on each worker pod's node with what the launcher exports (-x),
// and ends when they do: 0 when every rank exited 0, else the first
// failure, after killing the others (as mpirun aborts a job).
type mpirun struct {
	mu      sync.Mutex
	procs   map[string][]*Proc // worker pod → its ranks
	code    int
	why     string
	pending int
	done    chan struct{}
	end     time.Time
}

func failedRun(why string) *mpirun {
	r := &mpirun{procs: map[string][]*Proc{}, code: 1, why: why, done: make(chan struct{}), end: time.Now()}
	close(r.done)
	return r
}

func (c *Cluster) startMPIRun(ctx context.Context, p *corev1.Pod) (*mpirun, error) {
	job := p.Labels["training.kubeflow.org/job-name"]
	cm, err := c.CP.Kube.CoreV1().ConfigMaps(p.Namespace).Get(ctx, job+"-config", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("hostfile: %w", err)
	}
	hosts, err := parseHostfile(cm.Data["hostfile"])
	if err != nil {
		return nil, err
	}
	if len(p.Spec.Containers) == 0 {
		return nil, fmt.Errorf("launcher pod %s has no container", p.Name)
	}
	exports, err := exportsOf(p, &p.Spec.Containers[0])
	if err != nil {
		return nil, err
	}
	world := 0
	for _, h := range hosts {
		world += h.slots
	}
	var ranks []Rank
	for _, h := range hosts {
		// HOST is NAME-worker-i.NAME.NAMESPACE.svc: its first label is the pod.
		pod, _, _ := strings.Cut(h.host, ".")
		wp, err := c.CP.Kube.CoreV1().Pods(p.Namespace).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("ssh: %s: %w", h.host, err)
		}
		n := c.Node(wp.Spec.NodeName)
		if n == nil || n.Dead() || wp.Status.Phase != corev1.PodRunning || wp.DeletionTimestamp != nil {
			return nil, fmt.Errorf("ssh: connect to host %s: no route to host (pod %s)", h.host, describe(wp))
		}
		for l := range h.slots {
			env := map[string]string{}
			for k, v := range exports {
				env[k] = v
			}
			r := len(ranks)
			env["OMPI_COMM_WORLD_RANK"], env["OMPI_COMM_WORLD_SIZE"] = strconv.Itoa(r), strconv.Itoa(world)
			env["OMPI_COMM_WORLD_LOCAL_RANK"] = strconv.Itoa(l)
			ranks = append(ranks, Rank{Rank: r, WorldSize: world, Node: n, Env: env, Pod: wp, Launcher: p})
		}
	}
	run := &mpirun{procs: map[string][]*Proc{}, pending: len(ranks), done: make(chan struct{})}
	for _, r := range ranks {
		proc := c.Launch(r)
		r.Node.Own(proc)
		run.procs[r.Pod.Name] = append(run.procs[r.Pod.Name], proc)
		go run.watch(r.Rank, proc)
	}
	return run, nil
}

func (r *mpirun) watch(rank int, p *Proc) {
	err := p.Wait()
	r.mu.Lock()
	first := r.code == 0 && err != nil
	if first {
		r.code = 1
		if ee, ok := err.(interface{ ExitCode() int }); ok && ee.ExitCode() > 0 {
			r.code = ee.ExitCode()
		}
		r.why = fmt.Sprintf("rank %d exited: %v", rank, err)
	}
	r.pending--
	last := r.pending == 0
	if last {
		r.end = time.Now()
	}
	r.mu.Unlock()
	if first {
		go r.stop() // mpirun aborts the job
	}
	if last {
		close(r.done)
	}
}

func (r *mpirun) ended() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *mpirun) endedAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.end
}

func (r *mpirun) result() (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.code, r.why
}

func (r *mpirun) uses(pod string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.procs[pod]) > 0
}

// stop kills every rank.
func (r *mpirun) stop() {
	r.mu.Lock()
	var all []*Proc
	for _, ps := range r.procs {
		all = append(all, ps...)
	}
	r.mu.Unlock()
	for _, p := range all {
		p.Kill()
	}
}

// stopWorker kills the ranks in one worker pod (its container stopped).
func (r *mpirun) stopWorker(pod string) {
	r.mu.Lock()
	ps := r.procs[pod]
	r.mu.Unlock()
	for _, p := range ps {
		p.Kill()
	}
}

type hostSlots struct {
	host  string
	slots int
}

func parseHostfile(s string) ([]hostSlots, error) {
	var hs []hostSlots
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		h := hostSlots{host: f[0], slots: 1}
		for _, opt := range f[1:] {
			if v, ok := strings.CutPrefix(opt, "slots="); ok {
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 {
					return nil, fmt.Errorf("hostfile line %q: bad slots", line)
				}
				h.slots = n
			}
		}
		hs = append(hs, h)
	}
	if len(hs) == 0 {
		return nil, fmt.Errorf("hostfile is empty")
	}
	return hs, nil
}

// exportsOf is what mpirun exports to the ranks: each `-x NAME=VALUE`
// and `-x NAME` (NAME's value in the launcher container, the downward
// API's fields resolved as a kubelet does) of the container's command
// and args.
func exportsOf(p *corev1.Pod, ctr *corev1.Container) (map[string]string, error) {
	env, err := envOf(p, ctr)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	argv := append(append([]string{}, ctr.Command...), ctr.Args...)
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] != "-x" {
			continue
		}
		name, val, ok := strings.Cut(argv[i+1], "=")
		if !ok {
			val = env[name]
		}
		out[name] = val
	}
	return out, nil
}

// envOf is the container's environment as a kubelet sets it: values,
// and the downward API's fields resolved.
func envOf(p *corev1.Pod, ctr *corev1.Container) (map[string]string, error) {
	env := map[string]string{}
	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			v, err := fieldValue(p, e.ValueFrom.FieldRef.FieldPath)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			env[e.Name] = v
		}
	}
	return env, nil
}

// startPodRun starts what runs in a pod of its own (not an MPI job's):
// the processes of the Cluster's RunPod hook, watched as an mpirun's ranks
// (the pod ends when they all did: 0 when every one exited 0, else the
// first failure, after the others are killed, as a container whose
// entrypoint, e.g. torchrun, stops its children when one fails).
func (c *Cluster) startPodRun(n *Node, p *corev1.Pod) (*mpirun, error) {
	if len(p.Spec.Containers) == 0 {
		return nil, fmt.Errorf("pod %s has no container", p.Name)
	}
	env, err := envOf(p, &p.Spec.Containers[0])
	if err != nil {
		return nil, err
	}
	procs := c.runPodHook()(PodRun{Node: n, Pod: p, Env: env})
	run := &mpirun{procs: map[string][]*Proc{}, pending: len(procs), done: make(chan struct{})}
	if len(procs) == 0 {
		return failedRun("nothing to run"), nil
	}
	for i, proc := range procs {
		n.Own(proc)
		run.procs[p.Name] = append(run.procs[p.Name], proc)
		go run.watch(i, proc)
	}
	return run, nil
}

// fieldValue resolves a downward API field path of p.
func fieldValue(p *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.name":
		return p.Name, nil
	case "metadata.namespace":
		return p.Namespace, nil
	case "metadata.uid":
		return string(p.UID), nil
	case "spec.nodeName":
		return p.Spec.NodeName, nil
	}
	for _, kind := range []struct {
		prefix string
		m      map[string]string
	}{{"metadata.labels['", p.Labels}, {"metadata.annotations['", p.Annotations}} {
		if k, ok := strings.CutPrefix(path, kind.prefix); ok {
			if k, ok = strings.CutSuffix(k, "']"); ok {
				return kind.m[k], nil
			}
		}
	}
	return "", fmt.Errorf("field path %q is not supported by the harness", path)
}
