package kube

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/regang"
	"rewind.dev/rewind/shm"
)

// fakeCoord is a Coordinator that records what it is asked. NodeDown hands
// a recovery of every job in jobsOn[node] to the job's follower, as the
// coordinator's WatchJob would, twice when dupEvents is set (a reopened
// watch seeing it again).
type fakeCoord struct {
	mu         sync.Mutex
	registered []*coordpb.RegisterJobRequest
	nodeDowns  []string
	restores   []string // "job step requestedBy"
	followers  map[string]regang.Driver
	follows    chan string // each Follow that started
	jobsOn     map[string][]string
	dupEvents  bool
	nodeErr    error
	restoreErr error
}

func newFakeCoord() *fakeCoord {
	return &fakeCoord{followers: map[string]regang.Driver{}, follows: make(chan string, 100), jobsOn: map[string][]string{}}
}

func (f *fakeCoord) RegisterJob(_ context.Context, req *coordpb.RegisterJobRequest) error {
	// The real coordinator refuses what is not a job id (a NAMESPACE/NAME
	// key once passed every test here and no real registration).
	if err := shm.ValidateJob(req.Job); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.registered = append(f.registered, req)
	return nil
}

func (f *fakeCoord) NodeDown(ctx context.Context, node, reason string) ([]string, error) {
	f.mu.Lock()
	if f.nodeErr != nil {
		defer f.mu.Unlock()
		return nil, f.nodeErr
	}
	f.nodeDowns = append(f.nodeDowns, node)
	jobs, id := f.jobsOn[node], int64(len(f.nodeDowns))
	drivers := map[string]regang.Driver{}
	for _, j := range jobs {
		drivers[j] = f.followers[j]
	}
	f.mu.Unlock()
	for _, j := range jobs {
		ev := &coordpb.JobEvent{Job: j, Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Ok: true, Step: 7, Reason: reason, DetectedUnixNano: id}
		for range 1 + btoi(f.dupEvents) {
			if d := drivers[j]; d != nil {
				if err := d.Regang(ctx, ev); err != nil {
					return nil, err
				}
			}
		}
	}
	return jobs, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (f *fakeCoord) Restore(_ context.Context, job string, step int64, who string) (*coordpb.PlanRestoreResponse, error) {
	if err := shm.ValidateJob(job); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restores = append(f.restores, fmt.Sprintf("%s %d %s", job, step, who))
	if f.restoreErr != nil {
		return nil, f.restoreErr
	}
	if step < 0 {
		step = 42
	}
	return &coordpb.PlanRestoreResponse{Job: job, Step: step, Executed: true, Ok: true, Ranks: []*coordpb.RankPlan{{Rank: 0}, {Rank: 1}}}, nil
}

// Restart is Restore, then, as the coordinator does, a regang event for
// the job's follower (waiting for one to follow).
func (f *fakeCoord) Restart(ctx context.Context, job string, step int64, who string) (*coordpb.PlanRestoreResponse, error) {
	res, err := f.Restore(ctx, job, step, who)
	if err != nil {
		return nil, err
	}
	step = res.Step
	var d regang.Driver
	for deadline := time.Now().Add(5 * time.Second); d == nil && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		f.mu.Lock()
		d = f.followers[job]
		f.mu.Unlock()
	}
	if d == nil {
		return nil, fmt.Errorf("fake: nobody follows %s", job)
	}
	ev := &coordpb.JobEvent{Job: job, Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Ok: true, Step: step, DetectedUnixNano: 1000 + step,
		Reason: fmt.Sprintf("operator restore of step %d asked by %s", step, who)}
	if err := d.Regang(ctx, ev); err != nil {
		return nil, err
	}
	return &coordpb.PlanRestoreResponse{Job: job, Step: step, Executed: true, Ok: true, Restarted: true,
		Ranks: []*coordpb.RankPlan{{Rank: 0}, {Rank: 1}}}, nil
}

func (f *fakeCoord) Follow(ctx context.Context, job string, d regang.Driver) error {
	if err := shm.ValidateJob(job); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	f.mu.Lock()
	f.followers[job] = d
	f.mu.Unlock()
	f.follows <- job
	<-ctx.Done()
	f.mu.Lock()
	delete(f.followers, job)
	f.mu.Unlock()
	return ctx.Err()
}

func (f *fakeCoord) snapshot() (reg []*coordpb.RegisterJobRequest, downs, restores []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.registered), slices.Clone(f.nodeDowns), slices.Clone(f.restores)
}

// harness is a controller on fake clientsets whose informers are seeded
// through their indexers (never started), a fake clock and a fake
// coordinator; tests call its sync functions directly.
type harness struct {
	t     *testing.T
	ctx   context.Context
	kube  *kubefake.Clientset
	dyn   *dynfake.FakeDynamicClient
	coord *fakeCoord
	rec   *record.FakeRecorder
	clock *testingclock.FakeClock
	c     *Controller
}

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func newHarness(t *testing.T, objs ...runtime.Object) *harness {
	t.Helper()
	var typed, dyn []runtime.Object
	for _, o := range objs {
		if _, ok := o.(*unstructured.Unstructured); ok {
			dyn = append(dyn, o)
		} else {
			typed = append(typed, o)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := &harness{
		t: t, ctx: ctx, kube: kubefake.NewClientset(typed...),
		dyn: dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{MPIJobs: "MPIJobList", JobSets: "JobSetList"}, dyn...),
		coord: newFakeCoord(), rec: record.NewFakeRecorder(100), clock: testingclock.NewFakeClock(t0),
	}
	h.rec.IncludeObject = true
	t.Cleanup(func() {
		checkPermitted(t, h.kube.Actions())
		checkPermitted(t, h.dyn.Actions())
	})
	h.c = h.newController()
	for _, o := range objs {
		h.seed(h.c, o)
	}
	return h
}

func (h *harness) newController() *Controller {
	cfg := DefaultConfig()
	cfg.Clock = h.clock
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.JobSets = true
	ki, di := Informers(h.kube, h.dyn, 0)
	c, err := New(cfg, h.kube, h.dyn, h.coord, h.rec, ki, di)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(c.queue.ShutDown)
	return c
}

// seed puts o in c's informer caches (adds or replaces).
func (h *harness) seed(c *Controller, o runtime.Object) {
	h.t.Helper()
	var err error
	switch o := o.(type) {
	case *unstructured.Unstructured:
		err = c.dynInformers.ForResource(workloadOf(o).Resource()).Informer().GetIndexer().Update(o)
	case *corev1.Pod:
		if o.Labels[labelJobSetName] != "" {
			err = c.jobSetPods.GetIndexer().Update(o)
			break
		}
		err = c.kubeInformers.Core().V1().Pods().Informer().GetIndexer().Update(o)
	case *corev1.Node:
		err = c.kubeInformers.Core().V1().Nodes().Informer().GetIndexer().Update(o)
	}
	if err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) syncJob(key string) {
	h.t.Helper()
	if err := h.c.syncJob(h.ctx, key); err != nil {
		h.t.Fatalf("syncJob(%s): %v", key, err)
	}
}

func (h *harness) syncNode(name string) {
	h.t.Helper()
	if err := h.c.syncNode(h.ctx, name); err != nil {
		h.t.Fatalf("syncNode(%s): %v", name, err)
	}
}

// events drains the recorded events.
func (h *harness) events() []string {
	var out []string
	for {
		select {
		case e := <-h.rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func (h *harness) mpiJob(ns, name string) *unstructured.Unstructured {
	h.t.Helper()
	u, err := h.dyn.Resource(MPIJobs).Namespace(ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return u
}

// podNames lists the pods left in ns.
func (h *harness) podNames(ns string) []string {
	pods, err := h.kube.CoreV1().Pods(ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

func newMPIJob(ns, name string, workers, slots int64, ann map[string]string) *unstructured.Unstructured {
	spec := map[string]any{
		"mpiReplicaSpecs": map[string]any{
			"Launcher": map[string]any{"replicas": int64(1)},
			"Worker":   map[string]any{"replicas": workers},
		},
	}
	if slots > 0 {
		spec["slotsPerWorker"] = slots
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
		"metadata": map[string]any{"namespace": ns, "name": name, "resourceVersion": "10"},
		"spec":     spec,
	}}
	u.SetAnnotations(ann)
	return u
}

func newPod(ns, job, role string, index int, node string) *corev1.Pod {
	name := fmt.Sprintf("%s-%s-%d", job, role, index)
	l := map[string]string{labelJobName: job, labelJobRole: role}
	if role == roleWorker {
		l[labelReplicaIndex] = fmt.Sprint(index)
	} else {
		name = fmt.Sprintf("%s-launcher-x%d", job, index)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: l},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func newLauncherJob(ns, job string) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: job + launcherSuffix}}
}

func newNode(name string, ready corev1.ConditionStatus, since time.Time) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "5"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: ready, Reason: "KubeletStopped", LastTransitionTime: metav1.NewTime(since),
		}}},
	}
}

// checkPermitted fails t for every call the fake clientsets saw that
// Permissions, and so the chart's RBAC (TestChartRBAC), does not grant.
func checkPermitted(t *testing.T, actions []k8stesting.Action) {
	t.Helper()
	for _, a := range actions {
		r := a.GetResource()
		res := r.Resource
		if sub := a.GetSubresource(); sub != "" {
			res += "/" + sub
		}
		if !slices.ContainsFunc(Permissions, func(p Permission) bool {
			return p.Group == r.Group && p.Resource == res && slices.Contains(p.Verbs, a.GetVerb())
		}) {
			t.Errorf("the controller called %s %s.%s, which Permissions (the chart's RBAC) does not grant", a.GetVerb(), res, r.Group)
		}
	}
}

func hasEvent(events []string, parts ...string) bool {
	return slices.ContainsFunc(events, func(e string) bool {
		for _, p := range parts {
			if !strings.Contains(e, p) {
				return false
			}
		}
		return true
	})
}
