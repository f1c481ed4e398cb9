package kube

import (
	"context"
	"fmt"

	"rewind.dev/rewind/api/coordpb"
	"rewind.dev/rewind/regang"
)

// Coordinator is what the controller asks of the coordinator. Its methods
// may be called concurrently; results belong to the caller.
type Coordinator interface {
	// RegisterJob declares a job's world size, placement, policy and
	// replicas (merged into what the coordinator knows).
	RegisterJob(ctx context.Context, req *coordpb.RegisterJobRequest) error
	// NodeDown declares node dead; the coordinator recovers every job
	// with a rank on it and returns them.
	NodeDown(ctx context.Context, node, reason string) ([]string, error)
	// Restore restores step (< 0: the newest restorable one) of job onto
	// the job's placement: each rank's node fetches its shard.
	Restore(ctx context.Context, job string, step int64, requestedBy string) (*coordpb.PlanRestoreResponse, error)
	// Restart is Restore, then the job restarts at the step: its later
	// steps are deleted and its followers get a regang event (Follow),
	// which restarts the gang.
	Restart(ctx context.Context, job string, step int64, requestedBy string) (*coordpb.PlanRestoreResponse, error)
	// Follow hands job's recoveries to d, in order, until ctx ends,
	// starting with the last one the coordinator made before the follow
	// began (a new leader's controller starts after its coordinator may
	// have recovered the job; the MPIJob driver is idempotent for one).
	Follow(ctx context.Context, job string, d regang.Driver) error
}

// GRPCCoordinator is a Coordinator reached through its gRPC API.
type GRPCCoordinator struct {
	API coordpb.CoordinatorClient
}

var _ Coordinator = GRPCCoordinator{}

func (g GRPCCoordinator) RegisterJob(ctx context.Context, req *coordpb.RegisterJobRequest) error {
	_, err := g.API.RegisterJob(ctx, req)
	return err
}

func (g GRPCCoordinator) NodeDown(ctx context.Context, node, reason string) ([]string, error) {
	res, err := g.API.NodeDown(ctx, &coordpb.NodeDownRequest{Node: node, Reason: reason})
	if err != nil {
		return nil, err
	}
	return res.Jobs, nil
}

func (g GRPCCoordinator) Restore(ctx context.Context, job string, step int64, requestedBy string) (*coordpb.PlanRestoreResponse, error) {
	res, err := g.API.PlanRestore(ctx, &coordpb.PlanRestoreRequest{Job: job, Step: step, RequestedBy: requestedBy})
	if err != nil {
		return nil, err
	}
	if !res.Ok {
		return res, fmt.Errorf("kube: restore of %s step %d did not complete on every rank", job, res.Step)
	}
	return res, nil
}

func (g GRPCCoordinator) Restart(ctx context.Context, job string, step int64, requestedBy string) (*coordpb.PlanRestoreResponse, error) {
	// The annotation is the operator's explicit ask: going back to an
	// older step (deleting later ones) is what it means.
	res, err := g.API.PlanRestore(ctx, &coordpb.PlanRestoreRequest{Job: job, Step: step, RequestedBy: requestedBy, Restart: true, Force: true})
	if err != nil {
		return nil, err
	}
	if !res.Ok || !res.Restarted {
		return res, fmt.Errorf("kube: restore of %s step %d did not complete on every rank", job, res.Step)
	}
	return res, nil
}

func (g GRPCCoordinator) Follow(ctx context.Context, job string, d regang.Driver) error {
	return regang.FollowReplaying(ctx, g.API, job, d, nil)
}
