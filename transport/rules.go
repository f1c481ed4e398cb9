package transport

import (
	"fmt"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/api/coordpb"
)

// A Rule says who may call one gRPC method over TLS. Calls over an
// agent's Unix socket (ranks on the node) are not checked here, nor
// calls to a server without TLS.
type Rule struct {
	// Roles may call the method; none: no TLS peer may (the method is
	// for the Unix socket only).
	Roles []Role
	// Check, when set, looks at each request a caller of an allowed role
	// sends, and says why it is refused (nil: allowed). It is how a node
	// is kept to speaking for itself.
	Check func(id Identity, req any) error
	// Uncertified lets a TLS caller with no verified certificate call the
	// method too: one that authenticates its caller itself (Enroll, with
	// a token).
	Uncertified bool
}

// DataPath is the agents' peer data path (agent/peerdata.go), which is
// not a gRPC method but is authorized as one.
const DataPath = "/rewind.agent.v1.Agent/PeerData"

// Roles that recur in the table.
var (
	nodeOnly  = []Role{RoleNode}
	operators = []Role{RoleOperator, RoleCoordinator}
	readers   = []Role{RoleReader, RoleOperator, RoleCoordinator}
	anyRole   = []Role{RoleNode, RoleReader, RoleOperator, RoleCoordinator}
	holders   = []Role{RoleNode, RoleCoordinator} // who may read a checkpoint's bytes
)

// Rules is the table of who may call what, for every method of the
// coordinator's and the agent's services (a test holds it to that): a
// method missing here is refused to every TLS peer.
//
//	node         an agent (and the ranks' supervisor on its node): reports
//	             for its own node only, reads peers' shards
//	coordinator  the coordinator and its Kubernetes controller: orders
//	             agents, and does what operators do
//	operator     readers' calls, and delete, restore, policies, NodeDown
//	reader       list, inspect, verify, watch, dry-run a restore
var Rules = map[string]Rule{
	// The coordinator's service.
	coordpb.Coordinator_Register_FullMethodName: {Roles: nodeOnly, Check: self(func(r *coordpb.RegisterRequest) []string {
		return append([]string{r.GetNode().GetName()}, recordNodes(r.Inventory)...)
	})},
	coordpb.Coordinator_RegisterJob_FullMethodName:  {Roles: []Role{RoleNode, RoleOperator, RoleCoordinator}, Check: registerJob},
	coordpb.Coordinator_Report_FullMethodName:       {Roles: nodeOnly, Check: self(reportNodes)},
	coordpb.Coordinator_ReportStream_FullMethodName: {Roles: nodeOnly, Check: self(reportNodes)},
	coordpb.Coordinator_Latest_FullMethodName:       {Roles: anyRole},
	coordpb.Coordinator_ListJobs_FullMethodName:     {Roles: anyRole}, // a node's supervisor compares its ranks with the placement
	coordpb.Coordinator_ListSteps_FullMethodName:    {Roles: readers},
	coordpb.Coordinator_InspectStep_FullMethodName:  {Roles: anyRole},
	coordpb.Coordinator_VerifyStep_FullMethodName:   {Roles: readers},
	coordpb.Coordinator_PlanRestore_FullMethodName:  {Roles: readers, Check: planRestore},
	coordpb.Coordinator_RankSources_FullMethodName: {Roles: []Role{RoleNode, RoleOperator, RoleCoordinator},
		Check: self(func(r *coordpb.RankSourcesRequest) []string { return []string{r.Node} })},
	// A node reports the tier copies its own reads found corrupt; the
	// coordinator verifies each before it believes it.
	coordpb.Coordinator_SuspectTierCopy_FullMethodName: {Roles: nodeOnly,
		Check: self(func(r *coordpb.SuspectTierCopyRequest) []string { return []string{r.Node} })},
	coordpb.Coordinator_DeleteStep_FullMethodName: {Roles: operators},
	coordpb.Coordinator_Transfers_FullMethodName: {Roles: nodeOnly,
		Check: self(func(r *coordpb.TransfersRequest) []string { return []string{r.Node} })},
	coordpb.Coordinator_TierReport_FullMethodName: {Roles: nodeOnly,
		Check: self(func(r *coordpb.TierReportRequest) []string { return []string{r.Node} })},
	coordpb.Coordinator_TierStatus_FullMethodName: {Roles: readers},
	coordpb.Coordinator_NodeDown_FullMethodName:   {Roles: operators},
	coordpb.Coordinator_WatchJob_FullMethodName:   {Roles: anyRole},
	coordpb.Coordinator_Audit_FullMethodName:      {Roles: readers},
	coordpb.Coordinator_Nodes_FullMethodName:      {Roles: anyRole}, // an agent checks a Fetch's peers
	// A node without a certificate yet; the token in the request proves
	// which node it is (coordinator/enroll.go).
	coordpb.Coordinator_Enroll_FullMethodName: {Roles: anyRole, Uncertified: true},

	// The agent's service on its TCP port. A rank's calls (Prepare to
	// Release, Consistent, ReportCorrupt) come over the Unix socket only.
	agentpb.Agent_Prepare_FullMethodName:       {},
	agentpb.Agent_Commit_FullMethodName:        {},
	agentpb.Agent_Open_FullMethodName:          {},
	agentpb.Agent_Release_FullMethodName:       {},
	agentpb.Agent_Fill_FullMethodName:          {},
	agentpb.Agent_Consistent_FullMethodName:    {},
	agentpb.Agent_ReportCorrupt_FullMethodName: {},
	agentpb.Agent_Read_FullMethodName:          {Roles: holders},
	DataPath:                                   {Roles: holders},
	agentpb.Agent_List_FullMethodName:          {Roles: anyRole},
	agentpb.Agent_Status_FullMethodName:        {Roles: anyRole},
	agentpb.Agent_Verify_FullMethodName:        {Roles: readers},
	agentpb.Agent_Delete_FullMethodName:        {Roles: operators},
	agentpb.Agent_Fetch_FullMethodName:         {Roles: []Role{RoleCoordinator}},
	agentpb.Agent_FinishRestore_FullMethodName: {Roles: []Role{RoleCoordinator}},
	agentpb.Agent_TierCopies_FullMethodName:    {Roles: readers},

	// Both daemons' metrics address (http.go).
	HTTPMetrics: {Roles: readers},
	HTTPReady:   {Roles: anyRole, Uncertified: true},
	HTTPDebug:   {Roles: operators},
}

// self is a Check that keeps a node to requests for its own node: nodes
// returns the node names a request speaks for. Other roles pass.
func self[T any](nodes func(T) []string) func(Identity, any) error {
	return func(id Identity, req any) error {
		if id.Role != RoleNode {
			return nil
		}
		r, ok := req.(T)
		if !ok {
			return fmt.Errorf("unexpected request %T", req)
		}
		for _, n := range nodes(r) {
			if !id.SpeaksFor(n) {
				return fmt.Errorf("the request speaks for node %q; a node speaks only for itself", n)
			}
		}
		return nil
	}
}

func reportNodes(r *coordpb.ReportRequest) []string {
	return append([]string{r.Node}, recordNodes(r.Shards)...)
}

// recordNodes are the nodes shard records name (an empty one is the
// reporting node).
func recordNodes(recs []*coordpb.ShardRecord) []string {
	var out []string
	for _, r := range recs {
		if r.Node != "" {
			out = append(out, r.Node)
		}
	}
	return out
}

// registerJob keeps a node's job registrations (a rank's first save on
// it) to placing ranks on itself, with no policy or replica count: those
// are an operator's (or the controller's, from the job's annotations).
func registerJob(id Identity, req any) error {
	r, ok := req.(*coordpb.RegisterJobRequest)
	if !ok || id.Role != RoleNode {
		return nil
	}
	if r.Policy != "" || r.Replicas != nil {
		return fmt.Errorf("a node may not set job %s's tier policy or replicas", r.Job)
	}
	for rank, node := range r.Placement {
		if !id.SpeaksFor(node) {
			return fmt.Errorf("the request places rank %d of job %s on node %q; a node places ranks only on itself", rank, r.Job, node)
		}
	}
	return nil
}

// planRestore lets a reader ask for a dry run only.
func planRestore(id Identity, req any) error {
	if r, ok := req.(*coordpb.PlanRestoreRequest); ok && id.Role == RoleReader && !r.DryRun {
		return fmt.Errorf("a reader may only dry-run a restore (job %s)", r.Job)
	}
	return nil
}
