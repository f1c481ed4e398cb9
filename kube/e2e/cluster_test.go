// Package e2e tests rewind's Kubernetes controller against a real
// kube-apiserver, kube-controller-manager and mpi-operator on loopback
// (internal/kubetest), with real rewind coordinators, agents and ranks.
// `make test-kube` builds what it needs and runs it; without
// REWIND_KUBE_BIN the tests skip (with REWIND_REQUIRE_KUBE=1 they fail).
package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/demo"
	"rewind.dev/rewind/internal/kubetest"
	"rewind.dev/rewind/kube"
	"rewind.dev/rewind/shm"
)

// env is everything a scenario runs against.
type env struct {
	t       *testing.T
	ctx     context.Context
	cp      *kubetest.ControlPlane
	cluster *kubetest.Cluster
	rewind  string // the rewind binary
	dir     string
	shmBase string

	coordAddr string
	coords    []*coordinator
	api       coordpb.CoordinatorClient
	sockets   map[string]string // node → its agent's socket
	// elastic holds the jobs whose ranks train the demo's elastic model
	// (one global state sharded over the ranks), with its global size.
	elastic map[string]string

	mu    sync.Mutex
	ranks []*rankRun // every rank process started, in order
}

// rankRun is one rank process the harness's mpirun started.
type rankRun struct {
	job      string
	rank     int
	node     string
	launcher string // the launcher pod's name and uid
	log      string
	proc     *kubetest.Proc
}

// steps and stepTime of the training job: long enough for a node loss,
// its recovery and an operator restore before it finishes.
const (
	trainSteps = 120
	stepTime   = 150 * time.Millisecond
)

func setup(t *testing.T) *env {
	bins, ok := kubetest.BinariesFromEnv()
	if !ok {
		if os.Getenv("REWIND_REQUIRE_KUBE") == "1" {
			t.Fatal("REWIND_KUBE_BIN is not set: run make test-kube")
		}
		t.Skip("no Kubernetes control plane: make test-kube builds one and runs these tests")
	}
	e := &env{t: t, ctx: t.Context(), rewind: os.Getenv("REWIND_BIN"), dir: t.TempDir(), sockets: map[string]string{}, elastic: map[string]string{}}
	if e.rewind == "" {
		t.Fatal("REWIND_BIN is not set: make test-kube sets it to bin/rewind")
	}
	var err error
	if e.shmBase, err = os.MkdirTemp("/dev/shm", "rewind-e2e-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(e.shmBase) })
	e.cp = kubetest.Start(t, bins)
	e.cluster = kubetest.NewCluster(t, e.cp, e.launch)
	e.installCRDs(bins)
	e.installChart()
	e.cp.Run("mpi-operator", bins.MPIOperator, []string{"--kubeConfig", e.cp.AdminKubeconfig, "--threadiness", "2", "--lock-namespace", "mpi-operator"}, nil)
	return e
}

// installCRDs applies mpi-operator's MPIJob CRD (from its module, as
// make kube-bin copies it) and creates the namespaces.
func (e *env) installCRDs(bins kubetest.Binaries) {
	for _, ns := range []string{"rewind", "mpi-operator"} {
		if _, err := e.cp.Kube.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			e.t.Fatal(err)
		}
	}
	// mpi-operator exits at start when the CRD is not served yet.
	e.applyCRD(filepath.Join(filepath.Dir(bins.MPIOperator), "kubeflow.org_mpijobs.yaml"), kube.MPIJobs)
}

// applyCRD applies the CRD in file path and waits until the API server
// serves its resource.
func (e *env) applyCRD(path string, res schema.GroupVersionResource) {
	e.applyPath(path)
	e.eventually(30*time.Second, res.Resource+" to be served and discovered", func() error {
		if _, err := e.cp.Dyn.Resource(res).List(e.ctx, metav1.ListOptions{}); err != nil {
			return err
		}
		// The controller looks for the resource in discovery, which
		// follows the CRD's establishment a little later.
		list, err := e.cp.Kube.Discovery().ServerResourcesForGroupVersion(res.GroupVersion().String())
		if err != nil {
			return err
		}
		for _, r := range list.APIResources {
			if r.Name == res.Resource {
				return nil
			}
		}
		return fmt.Errorf("%s not in discovery", res.Resource)
	})
}

// installChart applies the chart as `helm template` renders it and
// checks the API server warned about nothing.
func (e *env) installChart() {
	path := os.Getenv("REWIND_CHART_RENDERED")
	if path == "" {
		e.t.Fatal("REWIND_CHART_RENDERED is not set: make test-kube renders the chart")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	objs, err := kubetest.Objects(b)
	if err != nil {
		e.t.Fatal(err)
	}
	a, err := kubetest.NewApplier(e.cp.Admin)
	if err != nil {
		e.t.Fatal(err)
	}
	e.cp.Warnings.Take()
	if err := a.Apply(e.ctx, "rewind", objs...); err != nil {
		e.t.Fatal(err)
	}
	if w := e.cp.Warnings.Take(); len(w) > 0 {
		e.t.Fatalf("the API server warned while the chart was applied: %q", w)
	}
}

// coordinator is one replica of `rewind coordinator --kube`.
type coordinator struct {
	identity, addr, metrics string
	tls                     bool // started with --tls-dir: its metrics address serves HTTPS
	proc                    *kubetest.Proc
}

func (c *coordinator) backend() kubetest.Backend {
	return kubetest.Backend{Addr: c.addr, Ready: c.readyURL()}
}

// readyURL is the coordinator's readiness probe's URL.
func (c *coordinator) readyURL() string {
	if c.tls {
		return "https://" + c.metrics + "/readyz"
	}
	return "http://" + c.metrics + "/readyz"
}

// runCoordinator starts a coordinator replica as the chart's
// ServiceAccount (a token from the TokenRequest API), so the controller
// has exactly the chart's RBAC, with the chart's lease; env and args are
// added to its environment and flags.
func (e *env) runCoordinator(identity string, env []string, args ...string) *coordinator {
	tok, err := e.cp.Kube.CoreV1().ServiceAccounts("rewind").CreateToken(e.ctx, "rewind-coordinator",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("token of the chart's ServiceAccount rewind/rewind-coordinator: %v", err)
	}
	kc := e.cp.WriteKubeconfig("coordinator-"+identity, tok.Status.Token)
	c := &coordinator{identity: identity, addr: kubetest.FreeAddr(e.t), metrics: kubetest.FreeAddr(e.t), tls: slices.Contains(args, "--tls-dir")}
	c.proc = kubetest.RunProc(e.t, e.dir, identity, e.rewind, append([]string{"coordinator",
		"--listen", c.addr, "--metrics", c.metrics, "--gossip", "", "--data", filepath.Join(e.dir, "data-"+identity),
		"--replicas", "1", "--kube", "--kubeconfig", kc, "--kube-node-grace", "1s",
		"--kube-lease-namespace", "rewind", "--kube-lease", "rewind-coordinator", "--kube-identity", identity, "--kube-lease-duration", "6s"}, args...), env)
	e.coords = append(e.coords, c)
	return c
}

// useCoordinator points agents and the test's client at addr (a
// coordinator, or a Service in front of several) and waits for it to
// serve.
func (e *env) useCoordinator(addr string) {
	e.coordAddr = addr
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	e.api = coordpb.NewCoordinatorClient(conn)
	e.eventually(60*time.Second, "a coordinator to lead and serve on "+addr, func() error {
		_, err := e.api.ListJobs(e.ctx, &coordpb.ListJobsRequest{})
		return err
	})
}

// addNode creates a Node and starts its agent with an NVMe tier (a
// directory; the example's policy puts every 10th step there), failure
// detection off: the node's loss is found by Kubernetes' Ready condition
// alone.
func (e *env) addNode(name string) *kubetest.Node {
	n := e.cluster.AddNode(e.ctx, name)
	sock := filepath.Join(e.dir, name+".sock")
	listen := kubetest.FreeAddr(e.t)
	p := kubetest.RunProc(e.t, e.dir, "agent-"+name, e.rewind, []string{"agent", "--node", name,
		"--shm-root", filepath.Join(e.shmBase, name), "--socket", sock, "--listen", listen, "--advertise", listen,
		"--metrics", "", "--coordinator", e.coordAddr, "--gossip", "",
		"--tier", "nvme=file://" + filepath.Join(e.dir, "nvme-"+name)}, nil)
	n.Own(p)
	e.sockets[name] = sock
	e.eventually(30*time.Second, "agent "+name+" to register", func() error {
		if p.Exited() {
			return fmt.Errorf("agent %s exited: %v", name, p.Wait())
		}
		if _, err := os.Stat(sock); err != nil {
			return err
		}
		return nil
	})
	return n
}

// launch runs a rank as the training container would: the job from what
// mpirun exports (REWIND_JOB, or REWIND_NAMESPACE and REWIND_JOB_NAME),
// rank and world size from OMPI_COMM_WORLD_*. The example's python3
// train.py is played by rewind's demo trainer, which reports a digest of
// its state at every step and at every resume.
func (e *env) launch(r kubetest.Rank) *kubetest.Proc {
	job := r.Env["REWIND_JOB"]
	if job == "" {
		var err error
		if job, err = shm.KubeJobFromEnv(func(k string) string { return r.Env[k] }); err != nil {
			e.t.Errorf("rank %d of %s: %v", r.Rank, r.Launcher.Name, err)
		}
	}
	name := fmt.Sprintf("rank-%s-%d-%s", job, r.Rank, r.Launcher.UID)
	args := []string{"demo-train", "--socket", e.sockets[r.Node.Name],
		"--job", job, "--rank", r.Env["OMPI_COMM_WORLD_RANK"], "--world-size", r.Env["OMPI_COMM_WORLD_SIZE"],
		"--steps", strconv.Itoa(trainSteps), "--size", "1MiB", "--step-time", stepTime.String()}
	e.mu.Lock()
	if size, ok := e.elastic[job]; ok {
		args = append(args, "--elastic", "--size", size)
	}
	e.mu.Unlock()
	p := kubetest.RunProc(e.t, e.dir, name, e.trainer(), args, nil)
	e.mu.Lock()
	e.ranks = append(e.ranks, &rankRun{job: job, rank: r.Rank, node: r.Node.Name, launcher: r.Launcher.Name + "/" + string(r.Launcher.UID), log: p.Log, proc: p})
	e.mu.Unlock()
	return p
}

// trainer is the demo trainer's binary, rewind-dev, which make build puts
// beside rewind.
func (e *env) trainer() string { return filepath.Join(filepath.Dir(e.rewind), "rewind-dev") }

// events reads the trainer's report of every rank process of job since
// run (the index into e.ranks), per rank.
func (e *env) events(job string, since int) map[int][]demo.Event {
	e.mu.Lock()
	runs := append([]*rankRun(nil), e.ranks[min(since, len(e.ranks)):]...)
	e.mu.Unlock()
	out := map[int][]demo.Event{}
	for _, r := range runs {
		if r.job != job {
			continue
		}
		f, err := os.Open(r.log)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if ev, err := demo.ParseEvent(sc.Text()); err == nil {
				out[r.rank] = append(out[r.rank], ev)
			}
		}
		f.Close()
	}
	return out
}

func (e *env) rankCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.ranks)
}

// digests maps (rank, step) to the digest of the state a rank saved at
// that step, from every process of job so far.
func (e *env) digests(job string) map[[2]int64]string {
	d := map[[2]int64]string{}
	for rank, evs := range e.events(job, 0) {
		for _, ev := range evs {
			if ev.Kind == demo.KindSaved {
				d[[2]int64{int64(rank), ev.Step}] = ev.Digest
			}
		}
	}
	return d
}

// resumed waits until every rank of job started since `since` resumed,
// all at one step, and checks each rank's state is bit-identical to what
// it saved at that step.
func (e *env) resumed(job string, world int, since int, timeout time.Duration) (step int64) {
	e.t.Helper()
	e.eventually(timeout, fmt.Sprintf("every rank of %s to resume", job), func() error {
		evs := e.events(job, since)
		step = -1
		for r := range world {
			var got *demo.Event
			for i := range evs[r] {
				if evs[r][i].Kind == demo.KindResumed {
					got = &evs[r][i]
				}
			}
			if got == nil {
				return fmt.Errorf("rank %d has not resumed (%d events)", r, len(evs[r]))
			}
			if step >= 0 && got.Step != step {
				return fmt.Errorf("rank %d resumed step %d, another %d", r, got.Step, step)
			}
			step = got.Step
		}
		return nil
	})
	saved := e.digests(job)
	for r, evs := range e.events(job, since) {
		for _, ev := range evs {
			if ev.Kind == demo.KindResumed && ev.Step == step {
				if want := saved[[2]int64{int64(r), step}]; want != ev.Digest {
					e.t.Fatalf("rank %d resumed step %d with digest %s, saved %q", r, step, ev.Digest, want)
				}
			}
		}
	}
	return step
}

// latest is the coordinator's newest consistent step of job.
func (e *env) latest(job string) int64 {
	res, err := e.api.Latest(e.ctx, &coordpb.LatestRequest{Job: job})
	if err != nil {
		return -1
	}
	return res.Step
}

// protected returns the newest consistent step of job that memory keeps
// through the loss of any one node (its every shard on two nodes): what
// a recovery from a node's loss must restore at least. -1 if none.
func (e *env) protected(job string) int64 {
	res, err := e.api.Latest(e.ctx, &coordpb.LatestRequest{Job: job})
	if err != nil {
		return -1
	}
	return res.Protected
}

func (e *env) eventually(timeout time.Duration, what string, check func() error) {
	e.t.Helper()
	if err := kubetest.Poll(e.ctx, timeout, check); err != nil {
		e.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// applyPath applies every object of the manifest file at path (cluster
// scoped, or namespaced where they say).
func (e *env) applyPath(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	objs, err := kubetest.Objects(b)
	if err != nil {
		e.t.Fatal(err)
	}
	a, err := kubetest.NewApplier(e.cp.Admin)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := a.Apply(e.ctx, "", objs...); err != nil {
		e.t.Fatal(err)
	}
}

// applyFile applies a manifest file of the repository (path from the
// repository root).
func (e *env) applyFile(path string, edit func(*unstructured.Unstructured)) *unstructured.Unstructured {
	b, err := os.ReadFile(filepath.Join("..", "..", path))
	if err != nil {
		e.t.Fatal(err)
	}
	objs, err := kubetest.Objects(b)
	if err != nil || len(objs) != 1 {
		e.t.Fatalf("%s: %d objects, %v", path, len(objs), err)
	}
	if edit != nil {
		edit(objs[0])
	}
	a, err := kubetest.NewApplier(e.cp.Admin)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := a.Apply(e.ctx, "default", objs[0]); err != nil {
		e.t.Fatal(err)
	}
	return objs[0]
}

// mpiJob reads an MPIJob.
func (e *env) mpiJob(ns, name string) *unstructured.Unstructured {
	u, err := e.cp.Dyn.Resource(kube.MPIJobs).Namespace(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

// eventsOf lists the Events of an object as "Type Reason: message".
func (e *env) eventsOf(ns, kind, name string) []string { return e.eventsFrom(ns, kind, name, "") }

// eventsFrom is eventsOf for the Events one component (e.g.
// rewind-coordinator) reported; "" is any.
func (e *env) eventsFrom(ns, kind, name, component string) []string {
	list, err := e.cp.Kube.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, ev := range list.Items {
		if ev.InvolvedObject.Kind == kind && ev.InvolvedObject.Name == name && (component == "" || ev.Source.Component == component) {
			out = append(out, ev.Type+" "+ev.Reason+": "+ev.Message)
		}
	}
	return out
}

// waitEvent waits for an Event of reason on an object whose message
// holds every one of words, and returns it.
func (e *env) waitEvent(ns, kind, name, reason string, timeout time.Duration, words ...string) string {
	e.t.Helper()
	var found string
	e.eventually(timeout, fmt.Sprintf("Event %s %q on %s %s/%s", reason, words, kind, ns, name), func() error {
		evs := e.eventsOf(ns, kind, name)
		for _, ev := range evs {
			if strings.Contains(ev, " "+reason+": ") && !slices.ContainsFunc(words, func(w string) bool { return !strings.Contains(ev, w) }) {
				found = ev
				return nil
			}
		}
		return fmt.Errorf("events so far: %q", evs)
	})
	return found
}

// workers returns the worker pods of MPIJob name by index.
func (e *env) workers(ns, name string) map[string]corev1.Pod {
	pods, err := e.cp.Kube.CoreV1().Pods(ns).List(e.ctx, metav1.ListOptions{LabelSelector: "training.kubeflow.org/job-name=" + name + ",training.kubeflow.org/job-role=worker"})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		out[p.Name] = p
	}
	return out
}

// forbidden returns the lines of the coordinators' logs where the API
// server refused them something (the chart's RBAC is short of what the
// controller calls).
func (e *env) forbidden() []string {
	var out []string
	for _, c := range e.coords {
		b, _ := os.ReadFile(c.proc.Log)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "forbidden") {
				out = append(out, c.identity+": "+l)
			}
		}
	}
	return out
}
