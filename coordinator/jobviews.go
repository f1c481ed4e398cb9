package coordinator

import (
	"fmt"
	"maps"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/units"
)

// ListJobs answers each job with its placement unless asked for the
// summary (coordpb.JobView): a placement is some 290 KB at 8,192 ranks
// on 1,024 nodes with node names of 28 characters, so the jobs' together
// pass the 4 MiB a client takes past about 14 such jobs. An answer
// without a view, as clients before views ask, carries every placement,
// or is refused with ErrTooLarge when that is more than a client takes.

// jobsField is ListJobsResponse.jobs, the field the answer is counted in.
const jobsField protowire.Number = 1

// listJobs answers ListJobs: the job req names (none if unknown), or
// every job, by id.
func (c *Coordinator) listJobs(req *coordpb.ListJobsRequest) (*coordpb.ListJobsResponse, error) {
	var placed bool
	switch req.View {
	case coordpb.JobView_JOB_VIEW_UNSPECIFIED:
		placed = true
	case coordpb.JobView_JOB_VIEW_SUMMARY:
	default:
		return nil, fmt.Errorf("%w: coordinator: ListJobs has no view %s", ErrInvalid, req.View.Label())
	}
	c.mu.Lock()
	if err := c.rebuildingLocked(req.Job); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	var ids []string
	switch {
	case req.Job == "":
		ids = slices.Sorted(maps.Keys(c.state.Jobs))
	case c.state.Jobs[req.Job] != nil:
		ids = []string{req.Job}
	}
	resp := &coordpb.ListJobsResponse{}
	size := 0
	for _, id := range ids {
		j := c.state.Jobs[id]
		pj := &coordpb.Job{Id: j.ID, WorldSize: j.WorldSize, LatestConsistent: j.answer(j.Latest), Protected: j.Protected, Steps: uint32(len(j.Steps)),
			Epoch: j.epochOf(), Nodes: nodesPlaced(j.Placement)}
		if placed {
			pj.Placement = maps.Clone(j.Placement)
		}
		// Stop once over: a refusal builds little more than what a
		// client takes, not every placement.
		if size += fieldSize(jobsField, proto.Size(pj)); size > clientMaxAnswer {
			c.mu.Unlock()
			return nil, jobsTooLarge(req, len(ids))
		}
		resp.Jobs = append(resp.Jobs, pj)
	}
	c.mu.Unlock()
	for _, j := range resp.Jobs { // after the index lock: tiering's lock comes first
		j.Policy = c.tiers.policyText(j.Id)
		el := c.elastic.get(j.Id)
		j.MinWorldSize, j.FullWorldSize, j.WorldSizeReason = el.Min, el.Full, el.Why
	}
	if proto.Size(resp) > clientMaxAnswer { // the policies and reasons counted too
		return nil, jobsTooLarge(req, len(ids))
	}
	return resp, nil
}

// nodesPlaced counts the nodes a placement names.
func nodesPlaced(placement map[uint32]string) uint32 {
	seen := make(map[string]struct{}, len(placement)/8+1)
	for _, n := range placement {
		seen[n] = struct{}{}
	}
	return uint32(len(seen))
}

// jobsTooLarge is a job listing over clientMaxAnswer: it says what to ask
// for instead.
func jobsTooLarge(req *coordpb.ListJobsRequest, jobs int) error {
	what := fmt.Sprintf("%d jobs with their placement are", jobs)
	switch {
	case req.Job != "" && req.View == coordpb.JobView_JOB_VIEW_UNSPECIFIED:
		what = fmt.Sprintf("job %s's placement is", req.Job)
	case req.View != coordpb.JobView_JOB_VIEW_UNSPECIFIED:
		what = fmt.Sprintf("the summaries of %d jobs are", jobs)
	}
	return fmt.Errorf("%w: coordinator: %s more than the %s one answer to a client holds: ask for view summary "+
		"(each job's nodes counted, no placement) or for one job, as rewind ls and rewind policy of this release do",
		ErrTooLarge, what, units.Bytes(clientMaxAnswer))
}
