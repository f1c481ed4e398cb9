package coordinator

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"rewind.dev/rewind/api/coordpb"
)

// An operator's restore that restarts the job (PlanRestore with restart)
// is a re-gang that no node failure started: the job resumes from the
// chosen step on its own placement, through the same steps as a recovery
// (regang): the ranks still running are told their gang is broken, the
// steps after the chosen one are deleted (no rank continues them, and a
// later save of the same number must not mix with them), every rank's
// shard is restored onto its node, and the job's watchers get a regang
// event, so that whatever runs the ranks (regang.Local, the MPIJob driver,
// a node supervisor) restarts them at the step.

// RestartJob restores step of job (the newest restorable one when step <
// 0, falling back past steps that cannot be restored whole) and restarts
// the job's ranks at it. A restart that would delete a later restorable
// consistent step — going back in time — is refused unless force. dryRun
// plans without acting. The plan says which steps were (or would be)
// deleted, and which it passed over. Every rank is staged before anything
// changes: when that fails, the running ranks are left alone and nothing
// is switched or deleted.
func (c *Coordinator) RestartJob(ctx context.Context, job string, step int64, who string, force, dryRun bool) (*coordpb.PlanRestoreResponse, error) {
	lock := c.jobLock(job)
	lock.Lock()
	defer lock.Unlock()
	plan, err := c.plan(ctx, job, step, nil)
	if err != nil {
		return nil, err
	}
	later, consistent, placement := c.laterSteps(job, plan.Step)
	plan.DroppedSteps = later
	if len(consistent) > 0 && !force {
		return nil, refuseGoingBack(job, plan.Step, consistent)
	}
	if dryRun {
		return plan, nil
	}
	planned := plan.Step
	plan, stage, err := c.restore(ctx, job, step, placement, plan, nil)
	if err != nil {
		return nil, err
	}
	if !plan.Ok {
		return plan, nil // the ranks say why; nothing was switched
	}
	// The step may be an older one now. Steps after the planned one are
	// the running ranks' saves since, which a restart discards as it
	// always did.
	later, consistent, _ = c.laterSteps(job, plan.Step)
	plan.DroppedSteps = later
	consistent = slices.DeleteFunc(consistent, func(s int64) bool { return s > planned })
	if len(consistent) > 0 && !force {
		_ = c.finishStage(context.WithoutCancel(ctx), plan, stage, false)
		return nil, refuseGoingBack(job, plan.Step, consistent)
	}
	c.log.Warn("job restart asked", "job", job, "step", plan.Step, "requested_by", who, "deleting_steps", later)
	ev := &coordpb.JobEvent{Job: job, Kind: coordpb.JobEventKind_JOB_EVENT_KIND_REGANG, Reason: fmt.Sprintf("operator restore of step %d asked by %s", plan.Step, who),
		DetectedUnixNano: c.cfg.Clock.Now().UnixNano()}
	target := gangTarget{placement: placement}
	if grown, ok := c.growTarget(job, placement); ok {
		target = grown
	}
	plan.Restarted = c.regang(ctx, plan, stage, -1, target, ev)
	if !plan.Restarted {
		// Failed after every rank was staged: the ranks' results do not
		// say why.
		return nil, fmt.Errorf("coordinator: restart of job %s at step %d: %s", job, plan.Step, ev.Error)
	}
	return plan, nil
}

func refuseGoingBack(job string, step int64, consistent []int64) error {
	return fmt.Errorf("%w: coordinator: restarting job %s at step %d would delete its later consistent steps %v; "+
		"ask again with force (rewind restore --force) to go back to step %d", ErrRefused, job, step, consistent, step)
}

// laterSteps returns the job's steps after step, those of them that are
// consistent and restorable (Step.usable: not one a restore found
// unrestorable), and the job's placement.
func (c *Coordinator) laterSteps(job string, step int64) (later, consistent []int64, placement map[uint32]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.state.Jobs[job]
	if j == nil {
		return nil, nil, nil
	}
	for _, s := range slices.Sorted(maps.Keys(j.Steps)) {
		if s > step {
			later = append(later, s)
			if j.Steps[s].usable() {
				consistent = append(consistent, s)
			}
		}
	}
	return later, consistent, maps.Clone(j.Placement)
}
