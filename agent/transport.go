package agent

import (
	"strings"

	"rewind.dev/rewind/api/agentpb"
	"rewind.dev/rewind/transport"
)

// initTransport sets up what protects the agent's TCP connections: the
// audit and the authorizer of its gRPC server and data path, the
// connections to its peers, and the transport's metrics.
func (a *Agent) initTransport() error {
	sec := a.cfg.Transport
	var err error
	if a.authz, err = transport.NewAuthorizer(sec, a.log, a.cfg.Registry); err != nil {
		return err
	}
	a.auditor = transport.NewAudit(auditRules, a.cfg.Clock, a.auditLine)
	a.peers.sec = sec
	return sec.Register(a.cfg.Registry)
}

// auditRules are the agent's calls that change what it holds, recorded
// whenever they are served (the coordinator's and operators' orders over
// TCP). A rank's calls over the socket are not: they are the save path.
// Every refused call is recorded, whatever its method.
var auditRules = map[string]transport.AuditRule{
	agentpb.Agent_Delete_FullMethodName: transport.Audited(func(req any) string {
		r := req.(*agentpb.DeleteRequest)
		return transport.Words("rank", r.Rank, "all_ranks", r.AllRanks)
	}),
	agentpb.Agent_Fetch_FullMethodName: transport.Audited(func(req any) string {
		r := req.(*agentpb.FetchRequest)
		srcs := make([]string, len(r.Sources))
		for i, s := range r.Sources {
			srcs[i] = s.Tier + ":" + s.Node
		}
		return transport.Words("rank", r.Rank, "stage", r.Stage, "sources", strings.Join(srcs, ","), "tiers", strings.Join(r.Tiers, ","))
	}),
	agentpb.Agent_FinishRestore_FullMethodName: transport.Audited(func(req any) string {
		r := req.(*agentpb.FinishRestoreRequest)
		return transport.Words("stage", r.Stage, "commit", r.Commit)
	}),
}

// auditLine writes an audit entry to the agent's log: the agent keeps no
// store, so its audit is its log (the coordinator keeps the cluster's).
func (a *Agent) auditLine(e transport.AuditEntry) {
	args := []any{"who", e.Who, "method", e.Method, "job", e.Job, "code", e.Code.String()}
	if e.HasStep {
		args = append(args, "step", e.Step)
	}
	if e.Detail != "" {
		args = append(args, "args", e.Detail)
	}
	if e.Error != "" {
		args = append(args, "error", e.Error)
	}
	a.log.Info("audit", args...)
}
