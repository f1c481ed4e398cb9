package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/clock"
	"rewind.dev/rewind/internal/demo"
)

// latestEvery is how often the poller asks the coordinator's Latest: four
// answers a step, so that a step that goes back is seen.
const latestEvery = 60 * time.Millisecond

// pollLatest asks the coordinator for the job's latest consistent step
// until ctx ends, recording each answer.
func (s *session) pollLatest(ctx context.Context) {
	for clock.Sleep(ctx, latestEvery) == nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := s.c.API.Latest(cctx, &coordpb.LatestRequest{Job: s.cfg.Job})
		cancel()
		if err != nil {
			continue // the coordinator is down or busy: no answer, nothing seen
		}
		s.hist.Add(Op{At: time.Now(), Client: "latest poller", Job: s.cfg.Job, Kind: OpLatest, Step: resp.Step,
			Epoch: resp.Epoch, EpochStep: resp.EpochStep})
	}
}

// listingOp records a snapshot of the coordinator: the steps it can
// restore (consistent, a copy of every rank, not marked unrestorable)
// and the steps durable on the shared tier.
func listingOp(job string, snap *Snapshot) Op {
	op := Op{At: snap.At, Client: "lister", Job: job, Kind: OpListing, Durable: map[string][]int64{}}
	for _, st := range snap.Steps {
		if restorableNow(st) {
			op.Steps = append(op.Steps, st.Step)
		}
	}
	slices.Sort(op.Steps)
	op.Durable["s3"] = snap.Durable("s3")
	return op
}

// restorableNow: consistent, not marked unrestorable, and every rank has
// a copy somewhere.
func restorableNow(st *coordpb.Step) bool {
	if st.State != coordpb.StepState_STEP_STATE_CONSISTENT || st.Unrestorable != nil {
		return false
	}
	for r := range st.WorldSize {
		if !slices.ContainsFunc(st.Copies, func(c *coordpb.Copy) bool { return c.Rank == r }) {
			return false
		}
	}
	return true
}

// recoveryOp records a recovery: the newest step restorable right before
// the fault that caused it, given the nodes lost by then. Called with
// s.mu held, after the event was appended to s.ev.Recoveries.
func (s *session) recoveryOp(ev *coordpb.JobEvent) Op {
	op := Op{At: time.Now(), Client: "recovery", Job: s.cfg.Job, Kind: OpRestore, Step: ev.Step, Newest: -1, Named: -1}
	if ev.PlannedUnixNano > 0 {
		op.At = time.Unix(0, ev.PlannedUnixNano)
	}
	op.Done = time.Now()
	for _, sk := range ev.Skipped {
		op.Skipped = append(op.Skipped, sk.Step)
	}
	lost := s.ev.lostFaults()
	if k := len(s.ev.Recoveries) - 1; k < len(lost) {
		i := lost[k]
		op.Newest = s.ev.Faults[i].Before.NewestRestorable(s.ev.lostBefore(i))
	}
	return op
}

// rankOps turns the ranks' reports into ops: every save acknowledged,
// every restore landed.
func rankOps(job string, lines []Line) []Op {
	var out []Op
	for _, l := range events(lines) {
		op := Op{At: l.At, Client: fmt.Sprintf("rank %d", l.Rank), Job: job, Rank: l.Rank, Step: l.Event.Step}
		switch l.Event.Kind {
		case demo.KindSaved:
			op.Kind = OpSave
		case demo.KindResumed:
			op.Kind = OpResumed
		default:
			continue
		}
		out = append(out, op)
	}
	return out
}

// historyCell is the history checker's verdict for the table.
func historyCell(c Check, n int) string {
	if !c.OK {
		return "FAIL"
	}
	return fmt.Sprintf("ok (%d ops)", n)
}
