package kubetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// Rank is one process of an MPI job that the harness's mpirun starts.
type Rank struct {
	Rank, WorldSize int
	Node            *Node
	Env             map[string]string // what mpirun exports (-x) and OMPI_COMM_WORLD_*
	Pod             *corev1.Pod       // the worker pod it runs in
	Launcher        *corev1.Pod
}

// Launch starts one rank's process (the test decides what runs).
type Launch func(r Rank) *Proc

// PodRun is a pod of its own (a JobSet's, a plain Job's: not an MPI
// job's launcher or worker) that the harness's kubelet starts.
type PodRun struct {
	Node *Node
	Pod  *corev1.Pod
	Env  map[string]string // its first container's, the downward API resolved
}

// RunPod starts what runs in a pod of its own (the test decides: e.g.
// torchrun's processes).
type RunPod func(r PodRun) []*Proc

// Node is a node the harness plays the kubelet of.
type Node struct {
	Name string
	// Procs are killed with the node (its agent, its ranks).
	mu    sync.Mutex
	procs []*Proc
	dead  bool
}

// Own makes p die with the node.
func (n *Node) Own(p *Proc) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.procs = append(n.procs, p)
}

// Dead reports whether the node was killed.
func (n *Node) Dead() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dead
}

// Cluster plays the kubelet of its nodes and the scheduler: pending pods
// are bound to a live node whose taints they tolerate (the fewest pods
// first), pods on live nodes are run (workers: Ready at once, as their
// sshd; launchers: the harness's mpirun), deleted pods on live nodes are
// stopped and removed, nodes renew their leases until Kill.
type Cluster struct {
	CP     *ControlPlane
	Launch Launch

	t        testing.TB
	mu       sync.Mutex
	nodes    map[string]*Node
	runs     map[types.UID]*mpirun // launcher pod → its mpirun
	started  map[types.UID]bool    // pods whose containers run
	restarts map[types.UID]int
	runPod   RunPod
}

// SetRunPod makes the cluster run pods of their own with f (none by
// default: such a pod runs with nothing in it).
func (c *Cluster) SetRunPod(f RunPod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runPod = f
}

// NewCluster starts playing kubelet and scheduler until the test ends.
func NewCluster(t testing.TB, cp *ControlPlane, launch Launch) *Cluster {
	c := &Cluster{CP: cp, Launch: launch, t: t, nodes: map[string]*Node{}, runs: map[types.UID]*mpirun{},
		started: map[types.UID]bool{}, restarts: map[types.UID]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.loop(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// AddNode creates a Ready Node object and renews its lease until Kill.
func (c *Cluster) AddNode(ctx context.Context, name string) *Node {
	c.t.Helper()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
	}
	if _, err := c.CP.Kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		c.t.Fatalf("kubetest: creating node %s: %v", name, err)
	}
	now := metav1.Now()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := c.CP.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		got.Status = corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi"), corev1.ResourcePods: resource.MustParse("110")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi"), corev1.ResourcePods: resource.MustParse("110")},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: now, LastTransitionTime: now}},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: name}},
		}
		_, err = c.CP.Kube.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		c.t.Fatalf("kubetest: node %s status: %v", name, err)
	}
	n := &Node{Name: name}
	c.mu.Lock()
	c.nodes[name] = n
	c.mu.Unlock()
	c.renewLease(ctx, n)
	return n
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[name]
}

// Kill is a node's sudden death: its processes are killed, its lease is
// no longer renewed (kube-controller-manager sets it Ready=Unknown after
// NodeMonitorGrace), and the harness runs nothing more there.
func (c *Cluster) Kill(n *Node) {
	n.mu.Lock()
	n.dead = true
	procs := n.procs
	n.procs = nil
	n.mu.Unlock()
	for _, p := range procs {
		p.Kill()
	}
}

func (c *Cluster) renewLease(ctx context.Context, n *Node) {
	leases := c.CP.Kube.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	renew := func() error {
		now := metav1.NewMicroTime(time.Now())
		l, err := leases.Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: n.Name},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n.Name), LeaseDurationSeconds: ptr.To(int32(40)), RenewTime: &now},
			}, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		l.Spec.RenewTime = &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	}
	if err := renew(); err != nil {
		c.t.Fatalf("kubetest: lease of node %s: %v", n.Name, err)
	}
	go func() {
		for !n.Dead() && ctx.Err() == nil {
			time.Sleep(time.Second) // the kubelet's renew interval is 10 s; 1 s keeps NodeMonitorGrace short
			if !n.Dead() {
				_ = renew()
			}
		}
	}()
}

// loop is the kubelets' and the scheduler's sync loop.
func (c *Cluster) loop(ctx context.Context) {
	for ctx.Err() == nil {
		pods, err := c.CP.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err == nil {
			for i := range pods.Items {
				c.syncPod(ctx, &pods.Items[i])
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	c.mu.Lock()
	runs := c.runs
	c.mu.Unlock()
	for _, r := range runs {
		r.stop()
	}
}

func (c *Cluster) syncPod(ctx context.Context, p *corev1.Pod) {
	n := c.Node(p.Spec.NodeName)
	switch {
	case p.Spec.NodeName == "":
		c.schedule(ctx, p)
	case n == nil || n.Dead():
		// No kubelet: the pod stays as the API server has it.
	case p.DeletionTimestamp != nil:
		c.stopPod(p)
		err := c.CP.Kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To(int64(0)), Preconditions: &metav1.Preconditions{UID: &p.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			c.t.Logf("kubetest: kubelet of %s: removing pod %s/%s: %v", n.Name, p.Namespace, p.Name, err)
		}
	case p.Status.Phase == corev1.PodPending || p.Status.Phase == "":
		c.startPod(ctx, n, p)
	case p.Status.Phase == corev1.PodRunning:
		c.reapLauncher(ctx, n, p)
	}
}

// schedule binds p to the live node with the fewest pods whose taints p
// tolerates.
func (c *Cluster) schedule(ctx context.Context, p *corev1.Pod) {
	if p.DeletionTimestamp != nil {
		return
	}
	nodes, err := c.CP.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	pods, err := c.CP.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	load := map[string]int{}
	for _, q := range pods.Items {
		load[q.Spec.NodeName]++
	}
	best := ""
	for _, node := range nodes.Items {
		h := c.Node(node.Name)
		if h == nil || h.Dead() || node.Spec.Unschedulable || !tolerates(p, node.Spec.Taints) {
			continue
		}
		if best == "" || load[node.Name] < load[best] {
			best = node.Name
		}
	}
	if best == "" {
		return // stays Pending, as with a real scheduler
	}
	err = c.CP.Kube.CoreV1().Pods(p.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, UID: p.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: best},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		c.t.Logf("kubetest: scheduler: binding %s/%s to %s: %v", p.Namespace, p.Name, best, err)
	}
}

func tolerates(p *corev1.Pod, taints []corev1.Taint) bool {
	for i := range taints {
		t := &taints[i]
		if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if !slices.ContainsFunc(p.Spec.Tolerations, func(tol corev1.Toleration) bool { return toleration(tol, t) }) {
			return false
		}
	}
	return true
}

// toleration reports whether tol tolerates t (Kubernetes' rule: the
// effect matches or is empty; the key matches, or is empty with Exists;
// Exists, or Equal with the same value).
func toleration(tol corev1.Toleration, t *corev1.Taint) bool {
	if tol.Effect != "" && tol.Effect != t.Effect {
		return false
	}
	if tol.Key != t.Key && !(tol.Key == "" && tol.Operator == corev1.TolerationOpExists) {
		return false
	}
	return tol.Operator == corev1.TolerationOpExists || tol.Value == t.Value
}

// startPod starts the pod's containers: a launcher's is mpirun, a pod of
// its own runs RunPod's processes, any other container just runs (a
// worker's sshd).
func (c *Cluster) startPod(ctx context.Context, n *Node, p *corev1.Pod) {
	c.mu.Lock()
	if c.started[p.UID] {
		c.mu.Unlock()
		return
	}
	c.started[p.UID] = true
	c.mu.Unlock()
	if isLauncher(p) {
		r, err := c.startMPIRun(ctx, p)
		if err != nil {
			c.t.Logf("kubetest: mpirun of %s/%s: %v", p.Namespace, p.Name, err)
			c.setTerminated(ctx, p, 1, err.Error())
			return
		}
		c.mu.Lock()
		c.runs[p.UID] = r
		c.mu.Unlock()
	} else if c.runPodHook() != nil && p.Labels["training.kubeflow.org/job-role"] == "" {
		r, err := c.startPodRun(n, p)
		if err != nil {
			c.t.Logf("kubetest: starting %s: %v", describe(p), err)
			c.setTerminated(ctx, p, 1, err.Error())
			return
		}
		c.mu.Lock()
		c.runs[p.UID] = r
		c.mu.Unlock()
	}
	c.setRunning(ctx, p)
}

// stopPod kills what runs in p (a launcher's ranks, any rank in a worker).
func (c *Cluster) stopPod(p *corev1.Pod) {
	c.mu.Lock()
	r := c.runs[p.UID]
	delete(c.runs, p.UID)
	var users []*mpirun
	for _, run := range c.runs {
		if run.uses(p.Name) {
			users = append(users, run)
		}
	}
	c.mu.Unlock()
	if r != nil {
		r.stop()
	}
	for _, run := range users {
		run.stopWorker(p.Name)
	}
}

// reapLauncher ends a launcher pod whose mpirun ended (or a pod of its
// own whose processes did): Succeeded when
// every rank exited 0, else Failed (restartPolicy Never) or restarted in
// place (OnFailure), as a kubelet does.
func (c *Cluster) reapLauncher(ctx context.Context, n *Node, p *corev1.Pod) {
	c.mu.Lock()
	r := c.runs[p.UID]
	c.mu.Unlock()
	if r == nil || !r.ended() {
		return
	}
	code, why := r.result()
	if code != 0 && p.Spec.RestartPolicy == corev1.RestartPolicyOnFailure {
		// CrashLoopBackOff: the kubelet restarts a failed container after
		// 10 s, doubling up to 5 min; the Job controller counts each
		// restart against the launcher's backoffLimit.
		c.mu.Lock()
		restarts := c.restarts[p.UID]
		c.mu.Unlock()
		if time.Since(r.endedAt()) < min(crashLoopBase<<restarts, 5*time.Minute) {
			return
		}
		c.mu.Lock()
		c.restarts[p.UID]++
		c.mu.Unlock()
		var nr *mpirun
		var err error
		if isLauncher(p) {
			nr, err = c.startMPIRun(ctx, p)
		} else {
			nr, err = c.startPodRun(n, p)
		}
		if err != nil {
			nr = failedRun(err.Error())
		}
		c.mu.Lock()
		c.runs[p.UID] = nr
		c.mu.Unlock()
		c.setRunning(ctx, p)
		return
	}
	c.mu.Lock()
	delete(c.runs, p.UID)
	c.mu.Unlock()
	c.setTerminated(ctx, p, code, why)
}

// crashLoopBase is the kubelet's first restart delay of a failed
// container.
const crashLoopBase = 10 * time.Second

func (c *Cluster) runPodHook() RunPod {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runPod
}

func isLauncher(p *corev1.Pod) bool {
	return p.Labels["training.kubeflow.org/job-role"] == "launcher"
}

func (c *Cluster) setRunning(ctx context.Context, p *corev1.Pod) {
	now := metav1.Now()
	c.mu.Lock()
	restarts := int32(c.restarts[p.UID])
	c.mu.Unlock()
	update := func(q *corev1.Pod) {
		q.Status.Phase = corev1.PodRunning
		q.Status.HostIP, q.Status.PodIP = "127.0.0.1", "127.0.0.1"
		q.Status.StartTime = &now
		q.Status.Conditions = readyConditions(corev1.ConditionTrue, now)
		q.Status.ContainerStatuses = nil
		for _, ctr := range q.Spec.Containers {
			q.Status.ContainerStatuses = append(q.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: ctr.Name, Image: ctr.Image, ImageID: ctr.Image, Ready: true, Started: ptr.To(true), RestartCount: restarts,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
			})
		}
	}
	c.updateStatus(ctx, p, update)
}

func (c *Cluster) setTerminated(ctx context.Context, p *corev1.Pod, code int, why string) {
	now := metav1.Now()
	update := func(q *corev1.Pod) {
		q.Status.Phase = corev1.PodSucceeded
		reason := "Completed"
		if code != 0 {
			q.Status.Phase, reason = corev1.PodFailed, "Error"
		}
		q.Status.Conditions = readyConditions(corev1.ConditionFalse, now)
		q.Status.ContainerStatuses = nil
		for _, ctr := range q.Spec.Containers {
			q.Status.ContainerStatuses = append(q.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: ctr.Name, Image: ctr.Image, ImageID: ctr.Image,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason, Message: why, FinishedAt: now}},
			})
		}
	}
	c.updateStatus(ctx, p, update)
}

func (c *Cluster) updateStatus(ctx context.Context, p *corev1.Pod, update func(*corev1.Pod)) {
	for range 5 {
		q, err := c.CP.Kube.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil || q.UID != p.UID {
			return
		}
		update(q)
		_, err = c.CP.Kube.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, q, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			if err != nil && !apierrors.IsNotFound(err) {
				c.t.Logf("kubetest: status of pod %s/%s: %v", p.Namespace, p.Name, err)
			}
			return
		}
	}
}

func readyConditions(s corev1.ConditionStatus, now metav1.Time) []corev1.PodCondition {
	var cs []corev1.PodCondition
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		st := s
		if t == corev1.PodScheduled || t == corev1.PodInitialized {
			st = corev1.ConditionTrue
		}
		cs = append(cs, corev1.PodCondition{Type: t, Status: st, LastTransitionTime: now})
	}
	return cs
}

// describe is a pod's name for messages.
func describe(p *corev1.Pod) string {
	return fmt.Sprintf("%s/%s on %s", p.Namespace, p.Name, strings.TrimSpace(p.Spec.NodeName))
}
