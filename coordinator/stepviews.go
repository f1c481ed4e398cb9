package coordinator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/tiers"
)

// The answers that show a job's steps (ListSteps, InspectStep) grow with
// its ranks, steps and copies; one gRPC message does not (4 MiB by
// default: about 59,000 copies). The views of coordpb.StepView that hold
// at any size count a step's copies (summary) and list them a page of
// whole ranks at a time (copies); a listing of summaries is paged by
// steps. An answer without a view, as clients before views ask, carries
// every copy, or is refused with ErrTooLarge when that is more than
// maxAnswerCopies.

const (
	// maxAnswerCopies bounds the copies an answer without a view carries:
	// about 2.3 MiB at some 71 bytes each, under the 4 MiB a gRPC client
	// takes by default with room for the steps' other fields.
	maxAnswerCopies = 32768
	// A listing of summaries: steps per page. A summary is at most a few
	// KiB (maxSummaryPlaces places, maxSummaryFailures failures), so a
	// page is at most about a MiB.
	defaultStepsPage = 64
	maxStepsPage     = 256
	// A page of a step's copies, in copies: 4,096 is about 290 KiB;
	// 16,384 about 1.2 MiB.
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

// ErrTooLarge is an answer that would carry more than one message holds,
// asked for without a view that pages it.
var ErrTooLarge = errors.New("answer too large")

// tooLarge says which views to ask for instead.
func tooLarge(what string, n int) error {
	return fmt.Errorf("%w: coordinator: %s more than %d copies, more than one answer carries: ask for view summary (counts) "+
		"or InspectStep's view copies (a page at a time), as rewind ls and rewind inspect of this release do", ErrTooLarge, what, n)
}

// Page tokens name where the next page starts: "step/N" for a listing,
// "rank/N" for a step's copies.
const (
	stepToken = "step/"
	rankToken = "rank/"
)

func parseToken(tok, prefix string) (int64, error) {
	if tok == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(strings.TrimPrefix(tok, prefix), 10, 64)
	if err != nil || !strings.HasPrefix(tok, prefix) || v < 0 {
		return 0, fmt.Errorf("%w: coordinator: page token %q is not one this call gave", ErrInvalid, tok)
	}
	return v, nil
}

// pageSize returns the page size asked for: def for 0, at most max.
func pageSize(asked uint32, def, max int) int {
	if asked == 0 {
		return def
	}
	return min(int(asked), max)
}

// listSteps answers ListSteps for job's steps, oldest first.
func (c *Coordinator) listSteps(ctx context.Context, req *coordpb.ListStepsRequest, steps []int64) (*coordpb.ListStepsResponse, error) {
	resp := &coordpb.ListStepsResponse{}
	switch req.View {
	case coordpb.StepView_STEP_VIEW_UNSPECIFIED:
	case coordpb.StepView_STEP_VIEW_SUMMARY:
		from, err := parseToken(req.PageToken, stepToken)
		if err != nil {
			return nil, err
		}
		steps = steps[sortedIndex(steps, from):]
		if n := pageSize(req.PageSize, defaultStepsPage, maxStepsPage); len(steps) > n {
			resp.NextPageToken = stepToken + strconv.FormatInt(steps[n], 10)
			steps = steps[:n]
		}
	default:
		return nil, fmt.Errorf("%w: coordinator: ListSteps has no view %s", ErrInvalid, req.View.Label())
	}
	copies := 0
	for _, n := range steps {
		v, err := c.view(ctx, req.Job, n, -1, nil)
		switch {
		case errors.Is(err, ErrNotFound):
			continue // deleted since
		case err != nil:
			return nil, err
		}
		var st *coordpb.Step
		if req.View == coordpb.StepView_STEP_VIEW_SUMMARY {
			st, err = v.summarized(ctx)
		} else {
			if copies += len(v.copies) + len(v.bad); copies > maxAnswerCopies {
				return nil, tooLarge(fmt.Sprintf("job %s's steps hold", req.Job), maxAnswerCopies)
			}
			st, err = v.proto(ctx)
		}
		if err != nil {
			return nil, err
		}
		st.Tiers = c.tiers.copiesOf(st.Job, st.Step)
		resp.Steps = append(resp.Steps, st)
	}
	return resp, nil
}

// sortedIndex returns the index of the first of sorted steps at or after
// from.
func sortedIndex(steps []int64, from int64) int {
	i, _ := slices.BinarySearch(steps, from)
	return i
}

// inspectStep answers InspectStep.
func (c *Coordinator) inspectStep(ctx context.Context, req *coordpb.InspectStepRequest) (*coordpb.InspectStepResponse, error) {
	var st *coordpb.Step
	resp := &coordpb.InspectStepResponse{}
	switch req.View {
	case coordpb.StepView_STEP_VIEW_UNSPECIFIED:
		v, err := c.view(ctx, req.Job, req.Step, -1, nil)
		if err != nil {
			return nil, err
		}
		if n := len(v.copies) + len(v.bad); n > maxAnswerCopies {
			return nil, tooLarge(fmt.Sprintf("job %s step %d holds %d copies,", req.Job, req.Step, n), maxAnswerCopies)
		}
		if st, err = v.proto(ctx); err != nil {
			return nil, err
		}
	case coordpb.StepView_STEP_VIEW_SUMMARY, coordpb.StepView_STEP_VIEW_COPIES:
		from, err := parseToken(req.PageToken, rankToken)
		if err != nil {
			return nil, err
		}
		if st, err = c.stepHead(ctx, req.Job, req.Step, req.View == coordpb.StepView_STEP_VIEW_SUMMARY || req.PageToken == ""); err != nil {
			return nil, err
		}
		if req.View == coordpb.StepView_STEP_VIEW_COPIES {
			if st.Copies, resp.NextPageToken, err = c.copiesPage(ctx, req.Job, req.Step, from, pageSize(req.PageSize, defaultCopiesPage, maxCopiesPage)); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("%w: coordinator: InspectStep has no view %s", ErrInvalid, req.View.Label())
	}
	st.Tiers = c.tiers.copiesOf(st.Job, st.Step)
	resp.Step = st
	return resp, nil
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
// until limit copies (at least one rank's), and the page token of the
// rest ("" if none). It locks c.mu for at most viewChunk ranks at a time.
func (c *Coordinator) copiesPage(ctx context.Context, job string, n, from int64, limit int) ([]*coordpb.Copy, string, error) {
	var out []*coordpb.Copy
	var st *Step
	r := uint64(from)
	for {
		if err := ctx.Err(); err != nil {
			return nil, "", fmt.Errorf("coordinator: reading job %s step %d: %w", job, n, err)
		}
		c.mu.Lock()
		now, err := c.stepLocked(job, n)
		if err == nil && st != nil && now != st {
			err = errStepChanged
		}
		if err != nil {
			c.mu.Unlock()
			return nil, "", err
		}
		st = now
		world := uint64(st.WorldSize)
		for end := min(r+viewChunk, world); r < end; r++ {
			cs, bad := st.Copies[uint32(r)], st.Bad[uint32(r)]
			if k := len(cs) + len(bad); k > 0 && len(out) > 0 && len(out)+k > limit {
				c.mu.Unlock()
				return out, rankToken + strconv.FormatUint(r, 10), nil
			}
			for _, cp := range slices.Concat(cs, bad) {
				out = append(out, copyProto(cp))
			}
		}
		c.mu.Unlock()
		if r >= world {
			return out, "", nil
		}
	}
}

// summarized returns the step as the API shows it with its copies
// counted (coordpb.StepSummary) and none listed, an unrestorable step's
// failures cut to the first maxSummaryFailures ranks.
func (v *stepView) summarized(ctx context.Context) (*coordpb.Step, error) {
	p := v.head()
	if u := p.Unrestorable; u != nil && len(u.Ranks) > maxSummaryFailures {
		u.RanksFailed, u.Ranks = uint32(len(u.Ranks)), u.Ranks[:maxSummaryFailures]
	}
	type place struct{ tier, node string }
	places := map[place]*coordpb.CopyCount{}
	byTier := map[string]*coordpb.CopyCount{}
	counted := make([]bool, v.WorldSize) // ranks whose size is in StepBytes
	s := &coordpb.StepSummary{}
	add := func(cp *Copy, corrupt bool) {
		pc := places[place{cp.Tier, cp.Node}]
		if pc == nil {
			pc = &coordpb.CopyCount{Tier: cp.Tier, Node: cp.Node}
			places[place{cp.Tier, cp.Node}] = pc
		}
		tc := byTier[cp.Tier]
		if tc == nil {
			tc = &coordpb.CopyCount{Tier: cp.Tier}
			byTier[cp.Tier] = tc
		}
		if pc.Copies == 0 {
			tc.Nodes++
		}
		s.Copies, pc.Copies, tc.Copies = s.Copies+1, pc.Copies+1, tc.Copies+1
		if corrupt {
			s.Corrupt, pc.Corrupt, tc.Corrupt = s.Corrupt+1, pc.Corrupt+1, tc.Corrupt+1
			return
		}
		s.Bytes, pc.Bytes, tc.Bytes = s.Bytes+cp.Size, pc.Bytes+cp.Size, tc.Bytes+cp.Size
		if cp.Rank < v.WorldSize && !counted[cp.Rank] {
			counted[cp.Rank] = true
			s.StepBytes += cp.Size
		}
	}
	for i, cp := range v.copies {
		if i%ctxEvery == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("coordinator: reading job %s step %d: %w", v.Job, v.Step, ctx.Err())
		}
		add(cp, cp.State == CopyCorrupt)
	}
	for _, cp := range v.bad {
		add(cp, true)
	}
	byPlace := func(a, b *coordpb.CopyCount) int {
		return cmp.Or(cmp.Compare(tierOrder(a.Tier), tierOrder(b.Tier)), strings.Compare(a.Tier, b.Tier), strings.Compare(a.Node, b.Node))
	}
	s.Tiers = slices.SortedFunc(maps.Values(byTier), byPlace)
	all := slices.SortedFunc(maps.Values(places), byPlace)
	s.PlacesTotal, s.Places = uint32(len(all)), all[:min(len(all), maxSummaryPlaces)]
	p.Summary = s
	return p, nil
}

// tierOrder orders tiers as a restore prefers them: memory, then the
// durable tiers in tiers.Names' order, then any other.
func tierOrder(tier string) int {
	if tier == "shm" {
		return 0
	}
	if i := slices.Index(durableTiers, tiers.Name(tier)); i >= 0 {
		return 1 + i
	}
	return 1 + len(durableTiers)
}

var durableTiers = tiers.Names()
