package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/demo"
	"rewind.dev/rewind/kube"
)

// elasticSize is the global model of the elastic MPIJob: 6 MiB, 1 MiB
// per rank at its full size.
const elasticSize = "6MiB"

// TestElasticMPIJob: the example MPIJob made elastic
// (rewind.dev/elastic: "min=2") with 3 workers × 2 slots on three nodes:
// no spare. A node dies: the coordinator restarts the job on the four
// ranks of the two live nodes, the driver sets the MPIJob's workers to 2
// (Event Resized) and deletes the gang; mpi-operator recreates the
// launcher and two workers, whose four ranks reshard the step the six
// saved and train on to the end with their rows of the full state.
func TestElasticMPIJob(t *testing.T) {
	e := setup(t)
	e.useCoordinator(e.runCoordinator("coordinator-0", nil).addr)
	for i := range 3 {
		e.addNode(fmt.Sprintf("node-%d", i))
	}
	const job = "default.train"
	e.elastic[job] = elasticSize
	e.applyFile("deploy/examples/mpijob-train.yaml", func(u *unstructured.Unstructured) {
		ann := u.GetAnnotations()
		ann[kube.AnnElastic] = "min=2"
		u.SetAnnotations(ann)
		_ = unstructured.SetNestedField(u.Object, int64(3), "spec", "mpiReplicaSpecs", "Worker", "replicas")
		// An elastic job's mpirun takes its ranks from the hostfile
		// (one per slot): a fixed -np would not fit the smaller gang.
		cs, _, _ := unstructured.NestedSlice(u.Object, "spec", "mpiReplicaSpecs", "Launcher", "template", "spec", "containers")
		c := cs[0].(map[string]any)
		args, _ := c["args"].([]any)
		if i := slices.Index(args, any("-np")); i >= 0 {
			c["args"] = slices.Delete(args, i, i+2)
		}
		_ = unstructured.SetNestedSlice(u.Object, cs, "spec", "mpiReplicaSpecs", "Launcher", "template", "spec", "containers")
	})
	ev := e.waitEvent("default", "MPIJob", "train", kube.ReasonRegistered, 60*time.Second, "6 ranks")
	t.Logf("API server: %s", ev)
	e.eventually(60*time.Second, "the job to train past step 12 on six ranks", func() error {
		if s := e.latest(job); s < 12 {
			return fmt.Errorf("latest consistent step %d", s)
		}
		return nil
	})
	old := e.workers("default", "train")
	dead := old["train-worker-2"].Spec.NodeName
	kept := e.protected(job)
	since := e.rankCount()
	killed := time.Now()
	e.cluster.Kill(e.cluster.Node(dead))
	notReady := e.notReadyAndTainted(dead)
	t.Logf("API server: MPIJob: %s", e.waitEvent("default", "MPIJob", "train", kube.ReasonResized, 60*time.Second, "4 ranks, was 6"))
	t.Logf("API server: MPIJob: %s", e.waitEvent("default", "MPIJob", "train", kube.ReasonRegang, 30*time.Second, "node "+dead+" down"))
	if w, _, _ := unstructured.NestedInt64(e.mpiJob("default", "train").Object, "spec", "mpiReplicaSpecs", "Worker", "replicas"); w != 2 {
		t.Fatalf("the MPIJob's workers after the elastic recovery: %d, want 2", w)
	}
	step := e.resumedRows(job, 4, since, 120*time.Second)
	restored := time.Now()
	if step < kept {
		t.Fatalf("the four ranks resumed step %d, older than %d, kept in two nodes' memory before the loss", step, kept)
	}
	var on []string
	for name, p := range e.workers("default", "train") {
		if p.Spec.NodeName == dead {
			t.Fatalf("worker %s placed on the dead node %s", name, dead)
		}
		on = append(on, name+" on "+p.Spec.NodeName)
	}
	slices.Sort(on)
	t.Logf("node %s lost: every one of the four ranks resumed step %d with its rows of the six ranks' state %v after NotReady (%v after the kill); now %s",
		dead, step, restored.Sub(notReady).Round(time.Millisecond), restored.Sub(killed).Round(time.Millisecond), strings.Join(on, ", "))
	e.eventually(120*time.Second, "the four ranks to finish with their rows of an uninterrupted run", func() error {
		return e.doneRows(job, 4, since)
	})
	jobs, err := e.api.ListJobs(e.ctx, &coordpb.ListJobsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs.Jobs {
		if j.Id == job && (j.WorldSize != 4 || j.MinWorldSize != 2 || j.FullWorldSize != 6 || j.WorldSizeReason == "") {
			t.Fatalf("the job at the coordinator: %v", j)
		}
	}
	if f := e.forbidden(); len(f) > 0 {
		t.Errorf("the API server refused the controller (the chart's RBAC is short):\n%s", strings.Join(f, "\n"))
	}
}

// resumedRows waits until every rank of job's gang of world ranks started
// since `since` resumed, all at one step, and checks that each holds its
// rows of the elastic model's state at that step.
func (e *env) resumedRows(job string, world, since int, timeout time.Duration) (step int64) {
	e.t.Helper()
	e.eventually(timeout, fmt.Sprintf("every rank of %s's gang of %d to resume", job, world), func() error {
		step = -1
		evs := e.events(job, since)
		for r := range world {
			i := slices.IndexFunc(evs[r], func(ev demo.Event) bool { return ev.Kind == demo.KindResumed })
			if i < 0 {
				return fmt.Errorf("rank %d has not resumed (%d events)", r, len(evs[r]))
			}
			if step >= 0 && evs[r][i].Step != step {
				return fmt.Errorf("rank %d resumed step %d, another %d", r, evs[r][i].Step, step)
			}
			step = evs[r][i].Step
		}
		return nil
	})
	ref := e.elasticReference(world, step)
	for r, evs := range e.events(job, since) {
		if i := slices.IndexFunc(evs, func(ev demo.Event) bool { return ev.Kind == demo.KindResumed }); i >= 0 && evs[i].Digest != ref[step][r] {
			e.t.Fatalf("rank %d of %d resumed step %d with digest %s; its rows of the full state: %s", r, world, step, evs[i].Digest, ref[step][r])
		}
	}
	return step
}

// doneRows checks that every rank of job's gang of world ranks started
// since `since` finished with its rows of an uninterrupted run.
func (e *env) doneRows(job string, world, since int) error {
	ref := e.elasticReference(world, trainSteps)
	evs := e.events(job, since)
	for r := range world {
		i := slices.IndexFunc(evs[r], func(ev demo.Event) bool { return ev.Kind == demo.KindDone })
		if i < 0 {
			return fmt.Errorf("rank %d has not finished", r)
		}
		if evs[r][i].Step != trainSteps || evs[r][i].Digest != ref[trainSteps][r] {
			e.t.Fatalf("rank %d of %d finished at step %d with digest %s; an uninterrupted run's: %s", r, world, evs[r][i].Step, evs[r][i].Digest, ref[trainSteps][r])
		}
	}
	return nil
}

func (e *env) elasticReference(world int, step int64) map[int64][]string {
	ref, err := demo.ElasticReference(6<<20, uint32(world), step)
	if err != nil {
		e.t.Fatal(err)
	}
	return ref
}
