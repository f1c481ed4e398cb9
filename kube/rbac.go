package kube

// Permission is an API call the controller makes: the RBAC rule the
// chart (deploy/helm/rewind) must grant, and no more. TestChartRBAC
// checks the rendered chart against Permissions.
type Permission struct {
	Group, Resource string
	Verbs           []string
	Namespaced      bool // granted in the release namespace only (a Role)
}

// Permissions lists every call, by who makes it.
var Permissions = []Permission{
	// The MPIJob informer (list, watch); the driver's fresh read (get) and
	// its annotation merge patches (patch).
	{Group: "kubeflow.org", Resource: "mpijobs", Verbs: []string{"get", "list", "watch", "patch"}},
	// The pod informer (list, watch); the driver's list of a job's pods and
	// their deletion.
	{Group: "", Resource: "pods", Verbs: []string{"list", "watch", "delete"}},
	// The JobSet informer (list, watch), when JobSets are served; the
	// driver's fresh read (get) and annotation merge patches (patch).
	{Group: "jobset.x-k8s.io", Resource: "jobsets", Verbs: []string{"get", "list", "watch", "patch"}},
	// The driver reads an MPIJob launcher's Job (is it the old gang's?),
	// lists a JobSet's child Jobs, and deletes them.
	{Group: "batch", Resource: "jobs", Verbs: []string{"get", "list", "delete"}},
	// The node informer; the driver's reads of a node failure detection
	// declared dead and of the nodes of the pods it deletes (dead: no
	// grace period); the taint's JSON patch.
	{Group: "", Resource: "nodes", Verbs: []string{"get", "list", "watch", "patch"}},
	// The event recorder creates Events and patches repeated ones.
	{Group: "", Resource: "events", Verbs: []string{"create", "patch"}},
	// The job token Secrets (Config.JobKeys): created in each managed
	// job's namespace, patched when they exist; never read or listed.
	{Group: "", Resource: "secrets", Verbs: []string{"create", "patch"}},
	// Node enrollment (TokenReviewer): the agents' tokens reviewed.
	{Group: "authentication.k8s.io", Resource: "tokenreviews", Verbs: []string{"create"}},
	// The CA bundle agents enroll with (cabundle.go), in the release
	// namespace.
	{Group: "", Resource: "configmaps", Verbs: []string{"get", "create", "update"}, Namespaced: true},
	// Leader election (resourcelock.LeaseLock: get, create, update).
	{Group: "coordination.k8s.io", Resource: "leases", Verbs: []string{"get", "create", "update"}, Namespaced: true},
}
