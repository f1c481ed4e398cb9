// Package kube is rewind's Kubernetes controller: it runs inside the
// coordinator and makes the coordinator manage Kubeflow MPIJobs
// (kubeflow.org/v2beta1) and JobSets (jobset.x-k8s.io/v1alpha2, when the
// API server serves them) that ask for it by annotation, re-gangs them
// when a node fails, and runs the restores operators ask for on the job.
//
// # Annotations on an MPIJob or a JobSet
//
//	rewind.dev/checkpoint: "enabled"   the job is managed (anything else: not)
//	rewind.dev/replicas: "1"           copies of each shard in other nodes' memory
//	rewind.dev/policy: "nvme:every=10,keep=2;s3:every=30m,keep=3"
//	rewind.dev/restore-step: "1200"    operator restore: restore this step and
//	                                   restart the gang ("latest": the newest
//	                                   restorable step); removed once handled
//	rewind.dev/procs-per-pod: "8"      JobSets: ranks per pod (default 1)
//	rewind.dev/elastic: "min=4"        MPIJobs: a node lost with no spare left
//	                                   shrinks the job (its workers) to the
//	                                   live nodes' ranks, at least 4, which
//	                                   reshard the step
//
// The controller writes rewind.dev/restoring-step (the step the gang was
// restarted to restore), rewind.dev/regang-id and rewind.dev/regang-at
// (which recovery did it and when, so a recovery reported twice restarts
// the gang once), rewind.dev/placed-regang (that step was restored onto
// the nodes the recreated pods landed on) and rewind.dev/restore-result
// (how the last operator restore ended).
//
// # Ranks
//
// The job's id at the coordinator is NAMESPACE.NAME (shm.KubeJobID). Its world size is
// Worker replicas × slotsPerWorker: mpi-operator writes a hostfile with
// slotsPerWorker slots per worker in worker-index order and Open MPI maps
// ranks by slot, so rank r runs in worker r / slotsPerWorker (its local
// rank is r % slotsPerWorker), and its node is that worker pod's node.
// Jobs that run ranks on the launcher (runLauncherAsWorker) are not
// supported.
//
// A JobSet's pods are numbered across spec.replicatedJobs in order (job
// index × parallelism + completion index, after the pods of the
// replicatedJobs before), and rank = pod index × procs-per-pod + local
// rank (jobset.go; docs/design/20261125_jobset.md).
//
// # Node faults
//
// A Node whose Ready condition has been False or Unknown for longer than
// Config.NodeGrace is declared dead at the coordinator (NodeDown), then
// tainted rewind.dev/unhealthy:NoSchedule so no gang is placed there again,
// with an Event on the Node. The taint is the record that the fault was
// handled: a fault seen twice, or by a new leader, is handled once. An
// operator removes the taint once the node is repaired.
//
// # Re-gang
//
// MPIJobDriver restarts a gang after the coordinator recovered it (see
// driver.go for the mechanism and why; a JobSet's: jobSetKind.deleteGang).
//
// Only the leader (LeaderElect, a coordination.k8s.io Lease) runs the
// controller.
package kube
