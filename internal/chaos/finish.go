package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/internal/units"
	"rewind.dev/rewind/tiers"
)

// finish gathers the final evidence (the coordinator's view, every node's
// report), runs the checks and makes the scenario's row.
func (s *session) finish(ctx context.Context, playErr error) (Row, []Check) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	var checks []Check
	if playErr != nil {
		checks = append(checks, Check{Name: "the scenario ran to the end", Detail: playErr.Error()})
	}
	if s.c.API != nil {
		if final, err := s.waitSnap(ctx, "answer from the coordinator", 30*time.Second, func(*Snapshot) bool { return true }); err == nil {
			s.ev.Final = final
		} else {
			checks = append(checks, Check{Name: "the coordinator answers at the end", Detail: err.Error()})
		}
	}
	for _, n := range nodeServices {
		stdout, _, err := s.c.Logs(ctx, n)
		if err != nil {
			checks = append(checks, Check{Name: "the nodes' reports can be read", Detail: err.Error()})
			continue
		}
		s.ev.Lines = append(s.ev.Lines, ParseLogs(n, stdout)...)
	}
	size, err := units.ParseBytes(s.cfg.Size)
	if err != nil {
		checks = append(checks, Check{Name: "the state size parses", Detail: err.Error()})
	}
	s.ev.Size, s.ev.Keep = int64(size), keepOf(s.ev.Final)
	var restored uint64
	if len(s.ev.Faults) > 0 && s.ev.Final != nil {
		var digests Check
		digests, restored = checkDigests(&s.ev, newReferences(s.ev.Size))
		checks = append(checks, checkResumed(&s.ev), digests, checkDurableKept(&s.ev), checkNewestRestorable(&s.ev), checkTierCopiesWhole(&s.ev),
			checkEpochs(&s.ev))
		if s.staleNode != "" {
			checks = append(checks, checkStaleQuiet(&s.ev, s.staleNode))
		}
		checks = append(checks, s.verifyNewest(ctx, "s3"))
	} else if playErr == nil {
		checks = append(checks, Check{Name: "a fault was injected", Detail: "the scenario injected none"})
	}
	checks = append(checks, s.extra...)
	for _, op := range rankOps(s.cfg.Job, s.ev.Lines) {
		s.hist.Add(op)
	}
	ops := s.hist.Ops()
	hist := CheckHistory(ops, s.ev.Keep)
	checks = append(checks, hist)
	for _, c := range checks {
		s.logf("%s %s: %s", mark(c.OK), c.Name, c.Detail)
	}
	row := s.row(checks, restored)
	row.History = historyCell(hist, len(ops))
	return row, checks
}

func mark(ok bool) string {
	if ok {
		return "✓"
	}
	return "✗"
}

// row makes the scenario's line of the table.
func (s *session) row(checks []Check, restored uint64) Row {
	r := Row{Scenario: s.name, Result: "PASS"}
	failed := 0
	for _, c := range checks {
		if !c.OK {
			failed++
		}
	}
	if failed > 0 {
		r.Result = fmt.Sprintf("FAIL (%d of %d checks)", failed, len(checks))
	}
	detected := append([]time.Duration(nil), s.detected...)
	for k, i := range s.ev.lostFaults() {
		if ev := s.ev.recoveryOf(k); ev != nil {
			detected = append(detected, time.Unix(0, ev.DetectedUnixNano).Sub(s.ev.Faults[i].At))
		}
	}
	recovered := append(resumedAfter(&s.ev), s.recovered...)
	r.Detected, r.Recovered = seconds(detected...), seconds(recovered...)
	r.StepsLost = counts(stepsLost(&s.ev)...)
	r.Bytes = bytesCell(restored + s.verified)
	return r
}

// keepOf returns each tier's retention from the job's policy (2, the
// compose file's, when it cannot be read).
func keepOf(snap *Snapshot) map[string]int {
	keep := map[string]int{"nvme": 2, "s3": 2}
	if snap == nil || snap.Job == nil || snap.Job.Policy == "" {
		return keep
	}
	p, err := tiers.ParsePolicy(snap.Job.Policy)
	if err != nil {
		return keep
	}
	for _, t := range p.Tiers {
		keep[string(t.Tier)] = t.Keep
	}
	return keep
}

// verifyNewest has the coordinator re-read every copy of the newest step
// durable on tier (VerifyStep: each holder checks every checksum). The
// copies on tier must all verify; the others count when they do. Copies
// on nodes a fault hit are left out: they may be gone for good.
func (s *session) verifyNewest(ctx context.Context, tier string) Check {
	c := Check{Name: "the newest step durable on " + tier + " re-reads clean"}
	hit := map[string]bool{}
	for _, f := range s.ev.Faults {
		hit[f.Node] = true
	}
	// The job trains on meanwhile, and retention deletes a tier's older
	// copies as newer ones land: the step is taken from a fresh snapshot,
	// and taken again if it was retired before the read-back began, or
	// while it ran (a copy on tier then fails the read, and a snapshot
	// taken after shows the step durable there no more). A copy missing
	// from a step still durable on tier fails the check.
	var step int64
	var n int
	var bytes uint64
	for attempt := 1; ; attempt++ {
		snap, err := s.snapshot(ctx)
		if err != nil {
			snap = s.ev.Final
		}
		if step = newest(snap.Durable(tier)); step < 0 {
			c.Detail = "no step is durable on " + tier
			return c
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := s.c.API.VerifyStep(cctx, &coordpb.StepRequest{Job: s.cfg.Job, Step: step})
		cancel()
		if err != nil {
			if status.Code(err) != codes.NotFound || attempt == 3 {
				c.Detail = fmt.Sprintf("step %d: %v", step, err)
				return c
			}
			continue
		}
		var bad string
		n, bytes, bad = verifiedCopies(resp, tier, hit)
		if bad == "" {
			break
		}
		if attempt == 3 || !s.retired(ctx, tier, step) {
			c.Detail = fmt.Sprintf("step %d: %s", step, bad)
			return c
		}
	}
	s.verified += bytes
	c.OK = n > 0
	c.Detail = fmt.Sprintf("step %d: %d copies (%s) verified", step, n, bytesCell(bytes))
	return c
}

// verifiedCopies counts the copies a VerifyStep found whole (leaving out
// those on nodes hit), and names the first copy on tier that was not.
func verifiedCopies(resp *coordpb.VerifyStepResponse, tier string, hit map[string]bool) (n int, bytes uint64, bad string) {
	for _, ch := range resp.Checks {
		if ch.Copy == nil || hit[ch.Copy.Node] {
			continue
		}
		switch {
		case ch.Ok:
			n++
			bytes += ch.Copy.SizeBytes
		case ch.Copy.Tier == tier:
			return n, bytes, fmt.Sprintf("rank %d on %s: %s", ch.Copy.Rank, tier, ch.Problem)
		}
		// A copy in memory or on NVMe may be gone by now: the job trains
		// on, and slots and retention recycle them.
	}
	return n, bytes, ""
}

// retired reports whether a fresh snapshot shows step durable on tier no
// more (retention deleting it); false when none can be taken.
func (s *session) retired(ctx context.Context, tier string, step int64) bool {
	snap, err := s.snapshot(ctx)
	return err == nil && !slices.Contains(snap.Durable(tier), step)
}
