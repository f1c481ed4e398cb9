package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"rewind.dev/rewind/api/coordpb"
)

// The answers that show a job's steps (ListSteps, InspectStep) grow with
// its ranks, steps and copies; one gRPC message does not (a client takes
// 4 MiB by default: some 60,000 copies with short node names, 14,000 with
// the longest). The views of coordpb.StepView that hold at any size count
// a step's copies (summary) and list them a page of whole ranks at a time
// (copies); a listing of summaries is paged by steps. A page is bounded
// by its items and by its bytes (pages.go). An answer without a view, as
// clients before views ask, carries every copy, or is refused with
// ErrTooLarge when that is more than a client takes.

const (
	// A listing of summaries: steps per page. A summary is some 3 KiB
	// with node names of 28 characters, 17 KiB with names of 253
	// (maxSummaryPlaces places); pageBytes cuts a page of those short.
	defaultStepsPage = 64
	maxStepsPage     = 256
	// A page of a step's copies, in copies: 4,096 is 270 KiB with node
	// names of 28 characters, 1.1 MiB with names of 253; 16,384 is 1.1
	// MiB with the short names, and cut short by pageBytes (at some
	// 7,000 copies) with the long ones.
	defaultCopiesPage = 4096
	maxCopiesPage     = 16384
	// maxSummaryPlaces bounds the places (tier and node) a summary
	// lists: enough to name every node of a small job, and a cell an
	// operator can read; the rest are counted.
	maxSummaryPlaces = 64
	// maxSummaryFailures bounds the ranks of an unrestorable step a
	// summary names; the rest are counted.
	maxSummaryFailures = 8
)

// The fields the answers' sizes are counted in.
const (
	stepsField  protowire.Number = 1 // ListStepsResponse.steps, InspectStepResponse.step
	copiesField protowire.Number = 7 // Step.copies
)

// errOverBudget is a step whose encoding is over the bytes left for it.
var errOverBudget = errors.New("coordinator: over budget")

// listSteps answers ListSteps for job's steps, oldest first.
func (c *Coordinator) listSteps(ctx context.Context, req *coordpb.ListStepsRequest, steps []int64) (*coordpb.ListStepsResponse, error) {
	switch req.View {
	case coordpb.StepView_STEP_VIEW_UNSPECIFIED:
		return c.listFull(ctx, req.Job, steps)
	case coordpb.StepView_STEP_VIEW_SUMMARY:
		return c.listSummaries(ctx, req, steps)
	}
	return nil, fmt.Errorf("%w: coordinator: ListSteps has no view %s", ErrInvalid, req.View.Label())
}

// listFull answers a listing without a view: every copy of every step,
// refused once that is more than a client takes.
func (c *Coordinator) listFull(ctx context.Context, job string, steps []int64) (*coordpb.ListStepsResponse, error) {
	resp := &coordpb.ListStepsResponse{}
	size := 0
	for _, n := range steps {
		v, err := c.view(ctx, job, n, -1, nil)
		switch {
		case errors.Is(err, ErrNotFound):
			continue // deleted since
		case err != nil:
			return nil, err
		}
		st, k, err := c.fullStep(ctx, v, clientMaxAnswer-size)
		switch {
		case errors.Is(err, errOverBudget):
			return nil, tooLarge(fmt.Sprintf("job %s's %d steps are", job, len(steps)))
		case err != nil:
			return nil, err
		}
		resp.Steps, size = append(resp.Steps, st), size+k
	}
	return resp, nil
}

// listSummaries answers a listing of summaries: a page of steps from
// the one its token names, up to its page size and pageBytes (at least
// one step).
func (c *Coordinator) listSummaries(ctx context.Context, req *coordpb.ListStepsRequest, steps []int64) (*coordpb.ListStepsResponse, error) {
	from, err := parseToken(req.PageToken, stepToken, req.Job, 0)
	if err != nil {
		return nil, err
	}
	resp := &coordpb.ListStepsResponse{}
	limit, size := pageSize(req.PageSize, defaultStepsPage, maxStepsPage), 0
	for _, n := range steps[sortedIndex(steps, from):] {
		if len(resp.Steps) == limit {
			resp.NextPageToken = pageToken(stepToken, req.Job, 0, n)
			break
		}
		v, err := c.view(ctx, req.Job, n, -1, nil)
		switch {
		case errors.Is(err, ErrNotFound):
			continue // deleted since
		case err != nil:
			return nil, err
		}
		st, err := v.summarized(ctx)
		if err != nil {
			return nil, err
		}
		st.Tiers = c.tiers.copiesOf(st.Job, st.Step)
		k := fieldSize(stepsField, proto.Size(st))
		if len(resp.Steps) > 0 && size+k > pageBytes {
			resp.NextPageToken = pageToken(stepToken, req.Job, 0, n)
			break
		}
		resp.Steps, size = append(resp.Steps, st), size+k
	}
	if len(resp.Steps) == 0 {
		return resp, nil
	}
	return resp, checkFits(resp, fmt.Sprintf("job %s step %d's summary", req.Job, resp.Steps[0].Step))
}

// sortedIndex returns the index of the first of sorted steps at or after
// from.
func sortedIndex(steps []int64, from int64) int {
	i, _ := slices.BinarySearch(steps, from)
	return i
}

// fullStep returns step v as the API shows it, with its tier copies and
// every copy in rank order, and its size as an answer's field; or
// errOverBudget, having built little more than budget bytes of it, when
// that is more than budget.
func (c *Coordinator) fullStep(ctx context.Context, v *stepView, budget int) (*coordpb.Step, int, error) {
	p := v.head()
	p.Tiers = c.tiers.copiesOf(v.Job, v.Step)
	size := proto.Size(p)
	if fieldSize(stepsField, size) > budget {
		return nil, 0, errOverBudget
	}
	for i, cp := range v.ordered() {
		if i%ctxEvery == 0 && ctx.Err() != nil {
			return nil, 0, fmt.Errorf("coordinator: reading job %s step %d: %w", v.Job, v.Step, ctx.Err())
		}
		pc := copyProto(cp)
		if size += fieldSize(copiesField, proto.Size(pc)); fieldSize(stepsField, size) > budget {
			return nil, 0, errOverBudget
		}
		p.Copies = append(p.Copies, pc)
	}
	return p, fieldSize(stepsField, size), nil
}

// inspectStep answers InspectStep.
func (c *Coordinator) inspectStep(ctx context.Context, req *coordpb.InspectStepRequest) (*coordpb.InspectStepResponse, error) {
	switch req.View {
	case coordpb.StepView_STEP_VIEW_UNSPECIFIED:
		v, err := c.view(ctx, req.Job, req.Step, -1, nil)
		if err != nil {
			return nil, err
		}
		st, _, err := c.fullStep(ctx, v, clientMaxAnswer)
		switch {
		case errors.Is(err, errOverBudget):
			return nil, tooLarge(fmt.Sprintf("job %s step %d's %d copies are", req.Job, req.Step, len(v.copies)+len(v.bad)))
		case err != nil:
			return nil, err
		}
		return &coordpb.InspectStepResponse{Step: st}, nil
	case coordpb.StepView_STEP_VIEW_SUMMARY, coordpb.StepView_STEP_VIEW_COPIES:
		return c.inspectPage(ctx, req)
	}
	return nil, fmt.Errorf("%w: coordinator: InspectStep has no view %s", ErrInvalid, req.View.Label())
}

// inspectPage answers InspectStep with a view: the step counted, or
// (view copies) a page of its copies, counted on the first.
func (c *Coordinator) inspectPage(ctx context.Context, req *coordpb.InspectStepRequest) (*coordpb.InspectStepResponse, error) {
	from, err := parseToken(req.PageToken, rankToken, req.Job, req.Step)
	if err != nil {
		return nil, err
	}
	copies := req.View == coordpb.StepView_STEP_VIEW_COPIES
	st, err := c.stepHead(ctx, req.Job, req.Step, !copies || req.PageToken == "")
	if err != nil {
		return nil, err
	}
	st.Tiers = c.tiers.copiesOf(st.Job, st.Step)
	resp := &coordpb.InspectStepResponse{Step: st}
	what := fmt.Sprintf("job %s step %d's summary", req.Job, req.Step)
	if copies {
		limit, budget := pageSize(req.PageSize, defaultCopiesPage, maxCopiesPage), pageBytes-proto.Size(st)
		if st.Copies, resp.NextPageToken, err = c.copiesPage(ctx, req.Job, req.Step, from, limit, budget); err != nil {
			return nil, err
		}
		if len(st.Copies) > 0 {
			what = fmt.Sprintf("job %s step %d with rank %d's copies", req.Job, req.Step, st.Copies[0].Rank)
		}
	}
	return resp, checkFits(resp, what)
}

// stepHead returns a step without its copies: summarized, or (cheaper)
// only its fields.
func (c *Coordinator) stepHead(ctx context.Context, job string, n int64, summarized bool) (*coordpb.Step, error) {
	if summarized {
		v, err := c.view(ctx, job, n, -1, nil)
		if err != nil {
			return nil, err
		}
		return v.summarized(ctx)
	}
	v, err := c.view(ctx, job, n, 0, nil) // rank 0's copies only: the step's fields
	if err != nil {
		return nil, err
	}
	return v.head(), nil
}

// copiesPage returns the copies of job's step n of whole ranks from
// rank from on, in rank order (a rank's found corrupt after its others),
// until limit copies or budget bytes of their encoding (at least one
// rank's), and the page token of the rest ("" if none).
func (c *Coordinator) copiesPage(ctx context.Context, job string, n, from int64, limit, budget int) ([]*coordpb.Copy, string, error) {
	var out []*coordpb.Copy
	var st *Step
	r, size := uint64(from), 0
	for {
		if err := ctx.Err(); err != nil {
			return nil, "", fmt.Errorf("coordinator: reading job %s step %d: %w", job, n, err)
		}
		chunk, world, err := c.copiesChunk(job, n, &st, r, max(limit-len(out), 64))
		if err != nil {
			return nil, "", err
		}
		for _, cs := range chunk {
			k := 0
			ps := make([]*coordpb.Copy, len(cs))
			for i, cp := range cs {
				ps[i] = copyProto(cp)
				k += fieldSize(copiesField, proto.Size(ps[i]))
			}
			if len(ps) > 0 && len(out) > 0 && (len(out)+len(ps) > limit || size+k > budget) {
				return out, pageToken(rankToken, job, n, int64(r)), nil
			}
			out, size, r = append(out, ps...), size+k, r+1
		}
		if r >= world {
			return out, "", nil
		}
	}
}

// copiesChunk copies out of the index the copies of job's step n of
// want ranks (at most viewChunk) from rank from on, each rank's found
// corrupt after its others, and returns them with the step's world size.
// *st is the step an earlier chunk was of: a step replaced meanwhile is
// errStepChanged.
func (c *Coordinator) copiesChunk(job string, n int64, st **Step, from uint64, want int) ([][]*Copy, uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now, err := c.stepLocked(job, n)
	if err == nil && *st != nil && now != *st {
		err = errStepChanged
	}
	if err != nil {
		return nil, 0, err
	}
	*st = now
	world := uint64(now.WorldSize)
	var out [][]*Copy
	for r := from; r < min(from+uint64(min(want, viewChunk)), world); r++ {
		out = append(out, slices.Concat(now.Copies[uint32(r)], now.Bad[uint32(r)]))
	}
	return out, world, nil
}

// summarized returns the step as the API shows it with its copies
// counted (coordpb.StepSummary) and none listed, an unrestorable step's
// failures cut to the first maxSummaryFailures ranks.
func (v *stepView) summarized(ctx context.Context) (*coordpb.Step, error) {
	p := v.head()
	if u := p.Unrestorable; u != nil && len(u.Ranks) > maxSummaryFailures {
		u.RanksFailed, u.Ranks = uint32(len(u.Ranks)), u.Ranks[:maxSummaryFailures]
	}
	var count coordpb.CopyCounter
	for i, cp := range v.copies {
		if i%ctxEvery == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("coordinator: reading job %s step %d: %w", v.Job, v.Step, ctx.Err())
		}
		count.Add(cp.Tier, cp.Node, cp.Rank, cp.Size, cp.State == CopyCorrupt)
	}
	for _, cp := range v.bad {
		count.Add(cp.Tier, cp.Node, cp.Rank, cp.Size, true)
	}
	p.Summary = count.Summary(maxSummaryPlaces)
	return p, nil
}
