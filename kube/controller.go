package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"rewind.dev/rewind/regang"
)

// Event reasons, on the MPIJob or JobSet unless said otherwise.
const (
	ReasonInvalidAnnotation = "InvalidAnnotation"
	ReasonInvalidSpec       = "InvalidSpec"
	ReasonRegistered        = "Registered"
	ReasonRegangAtRisk      = "RegangAtRisk" // runPolicy.backoffLimit may fail the MPIJob before a re-gang
	ReasonRegang            = "Regang"
	ReasonResized           = "Resized"          // an elastic recovery changed the world size
	ReasonRegangImpossible  = "RegangImpossible" // mpi-operator would not recreate the gang
	ReasonRestored          = "Restored"
	ReasonRestoreFailed     = "RestoreFailed"
	ReasonShardsPlaced      = "ShardsPlaced"
	ReasonNodeDown          = "NodeDown" // on the Node
)

// Controller watches MPIJobs (and JobSets, with Config.JobSets), their
// pods and the nodes, and keeps the coordinator's view of managed jobs in
// step with them. Run it once; only the leader runs it (LeaderElect).
type Controller struct {
	cfg      Config
	log      *slog.Logger
	kube     kubernetes.Interface
	coord    Coordinator
	recorder record.EventRecorder
	driver   *MPIJobDriver

	kubeInformers informers.SharedInformerFactory
	dynInformers  dynamicinformer.DynamicSharedInformerFactory
	jobs          cache.GenericLister
	pods          corelisters.PodLister
	nodes         corelisters.NodeLister
	synced        []cache.InformerSynced
	// The JobSets and their pods, with Config.JobSets (else nil).
	jobSets    cache.GenericLister
	jobSetPods cache.SharedIndexInformer

	queue workqueue.TypedRateLimitingInterface[item]

	mu         sync.Mutex
	registered map[item]string             // job → the last RegisterJob sent, as text
	reported   map[item]string             // job → the last problem reported by Event
	followers  map[item]context.CancelFunc // job → stops following its recoveries
	downed     map[string]string           // node not Ready since → nodeDeclared, nodeTainted
}

// item is a unit of work: a node, an MPIJob or a JobSet (namespace/name).
type item struct {
	node   bool
	jobSet bool
	key    string
}

// workload is the kind of the job it names.
func (it item) workload() workload {
	if it.jobSet {
		return jobSets
	}
	return mpiJobs
}

// Informers returns the informer factories the controller needs (pods,
// nodes, MPIJobs of every namespace). Its pod informer watches only the
// pods of MPIJobs (those labelled training.kubeflow.org/job-name), not
// every pod of the cluster.
func Informers(kube kubernetes.Interface, dyn dynamic.Interface, resync time.Duration) (informers.SharedInformerFactory, dynamicinformer.DynamicSharedInformerFactory) {
	k := informers.NewSharedInformerFactoryWithOptions(kube, resync)
	k.InformerFor(&corev1.Pod{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredPodInformer(c, metav1.NamespaceAll, resync,
			cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
			func(o *metav1.ListOptions) { o.LabelSelector = labelJobName })
	})
	return k, dynamicinformer.NewDynamicSharedInformerFactory(dyn, resync)
}

// New returns a controller using the given informer factories (which Run
// starts) and recorder (NewRecorder, or a fake in tests).
func New(cfg Config, kube kubernetes.Interface, dyn dynamic.Interface, coord Coordinator, recorder record.EventRecorder,
	ki informers.SharedInformerFactory, di dynamicinformer.DynamicSharedInformerFactory) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Controller{
		cfg: cfg, log: cfg.Logger, kube: kube, coord: coord, recorder: recorder,
		driver:        &MPIJobDriver{Kube: kube, Dyn: dyn, Recorder: recorder, Log: cfg.Logger, Clock: cfg.Clock},
		kubeInformers: ki, dynInformers: di,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[item](),
			workqueue.TypedRateLimitingQueueConfig[item]{Name: "rewind", Clock: cfg.Clock}),
		registered: map[item]string{}, reported: map[item]string{},
		followers: map[item]context.CancelFunc{}, downed: map[string]string{},
	}
	ji := di.ForResource(MPIJobs).Informer()
	pi := ki.Core().V1().Pods().Informer()
	ni := ki.Core().V1().Nodes().Informer()
	c.jobs = di.ForResource(MPIJobs).Lister()
	c.pods = ki.Core().V1().Pods().Lister()
	c.nodes = ki.Core().V1().Nodes().Lister()
	c.synced = []cache.InformerSynced{ji.HasSynced, pi.HasSynced, ni.HasSynced}
	handlers := []struct {
		inf cache.SharedIndexInformer
		key func(any) (item, bool)
	}{{ji, jobItem}, {pi, podItem}, {ni, nodeItem}}
	if cfg.JobSets {
		si := di.ForResource(JobSets).Informer()
		c.jobSets = di.ForResource(JobSets).Lister()
		c.jobSetPods = coreinformers.NewFilteredPodInformer(kube, metav1.NamespaceAll, cfg.Resync,
			cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
			func(o *metav1.ListOptions) { o.LabelSelector = labelJobSetName })
		c.synced = append(c.synced, si.HasSynced, c.jobSetPods.HasSynced)
		handlers = append(handlers, []struct {
			inf cache.SharedIndexInformer
			key func(any) (item, bool)
		}{{si, jobSetItem}, {c.jobSetPods, jobSetPodItem}}...)
	}
	for _, h := range handlers {
		key := h.key
		add := func(obj any) {
			if it, ok := key(obj); ok {
				c.queue.Add(it)
			}
		}
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: add, UpdateFunc: func(_, obj any) { add(obj) }, DeleteFunc: add,
		}); err != nil {
			return nil, fmt.Errorf("kube: %w", err)
		}
	}
	return c, nil
}

func jobItem(obj any) (item, bool) {
	k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	return item{key: k}, err == nil
}

func jobSetItem(obj any) (item, bool) {
	k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	return item{jobSet: true, key: k}, err == nil
}

// jobSetPodItem is the JobSet that a pod belongs to, by the JobSet
// controller's label.
func jobSetPodItem(obj any) (item, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Labels[labelJobSetName] == "" {
		return item{}, false
	}
	return item{jobSet: true, key: jobKey(p.Namespace, p.Labels[labelJobSetName])}, true
}

func nodeItem(obj any) (item, bool) {
	k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	return item{node: true, key: k}, err == nil
}

// podItem is the MPIJob that a pod belongs to, by mpi-operator's label.
func podItem(obj any) (item, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Labels[labelJobName] == "" {
		return item{}, false
	}
	return item{key: jobKey(p.Namespace, p.Labels[labelJobName])}, true
}

// Run starts the informers, waits for their caches and processes work
// until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	c.kubeInformers.Start(ctx.Done())
	c.dynInformers.Start(ctx.Done())
	if c.jobSetPods != nil {
		go c.jobSetPods.Run(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return errors.New("kube: informer caches did not sync")
	}
	c.log.Info("kube controller running", "workers", c.cfg.Workers, "node_grace", c.cfg.NodeGrace, "jobsets", c.cfg.JobSets)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() { wait.UntilWithContext(ctx, c.runWorker, time.Second) })
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	c.stopFollowers()
	return nil
}

func (c *Controller) runWorker(ctx context.Context) {
	for c.processNextItem(ctx) {
	}
}

func (c *Controller) processNextItem(ctx context.Context) bool {
	it, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(it)
	if err := c.sync(ctx, it); err != nil {
		c.log.Warn("kube: retrying", "node", it.node, "key", it.key, "err", err)
		c.queue.AddRateLimited(it)
		return true
	}
	c.queue.Forget(it)
	return true
}

func (c *Controller) sync(ctx context.Context, it item) error {
	if it.node {
		return c.syncNode(ctx, it.key)
	}
	return c.syncWorkload(ctx, it)
}

// lister is the cache of w's jobs.
func (c *Controller) lister(w workload) cache.GenericLister {
	if w == jobSets {
		return c.jobSets
	}
	return c.jobs
}

// jobPods lists the pods w's controller made for job name.
func (c *Controller) jobPods(w workload, namespace, name string) ([]*corev1.Pod, error) {
	sel := labels.SelectorFromSet(labels.Set{w.podLabel(): name})
	if w == jobSets {
		return corelisters.NewPodLister(c.jobSetPods.GetIndexer()).Pods(namespace).List(sel)
	}
	return c.pods.Pods(namespace).List(sel)
}

// startFollow follows job's recoveries (re-gangs by the driver) until
// stopFollow or ctx ends; a follow that fails starts over.
func (c *Controller) startFollow(ctx context.Context, it item, job string, d regang.Driver) {
	key := it.key
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.followers[it]; ok {
		return
	}
	fctx, cancel := context.WithCancel(ctx)
	c.followers[it] = cancel
	go wait.UntilWithContext(fctx, func(ctx context.Context) {
		if err := c.coord.Follow(ctx, job, d); err != nil && ctx.Err() == nil {
			c.log.Warn("kube: following recoveries", strings.ToLower(it.workload().Kind()), key, "job", job, "err", err)
		}
	}, time.Second)
}

func (c *Controller) stopFollow(it item) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cancel, ok := c.followers[it]; ok {
		cancel()
		delete(c.followers, it)
	}
}

func (c *Controller) stopFollowers() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for job, cancel := range c.followers {
		cancel()
		delete(c.followers, job)
	}
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
