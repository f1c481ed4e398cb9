package bench

import "rewind.dev/rewind/api/agentpb"

func deleteAll(job string) *agentpb.DeleteRequest {
	return &agentpb.DeleteRequest{Job: job, AllRanks: true, Step: -1}
}
