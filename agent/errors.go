package agent

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"rewind.dev/rewind/shm"
)

// Kinds of failure; errors returned by the agent wrap one of them, and the
// server edge turns them into gRPC codes in one place (toStatus).
var (
	ErrInvalid  = errors.New("invalid argument")
	ErrNotFound = errors.New("not found")
	ErrBudget   = errors.New("memory budget exhausted")
	ErrBusy     = errors.New("slot not available")
	// ErrNoCoordinator: a job-wide question asked of an agent started
	// with no --coordinator; FailedPrecondition, as ErrBusy.
	ErrNoCoordinator = errors.New("agent: without a coordinator")
	// ErrUnknownPeer: a Fetch named a peer the coordinator does not know
	// (fetchpeers.go).
	ErrUnknownPeer = errors.New("not a node the coordinator knows")
)

// jobBudgetError: a job's segments would pass its share of the node's
// budget (Config.JobBudgetBytes). It is an ErrBudget; room made by
// dropping other jobs' replicas does not help it.
type jobBudgetError struct{ msg string }

func (e *jobBudgetError) Error() string        { return e.msg }
func (e *jobBudgetError) Is(target error) bool { return target == ErrBudget }

func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var nospace *shm.NoSpaceError
	code := codes.Internal
	switch {
	case errors.Is(err, ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, ErrBudget), errors.As(err, &nospace):
		code = codes.ResourceExhausted
	case errors.Is(err, ErrUnknownPeer):
		code = codes.PermissionDenied
	case errors.Is(err, ErrBusy), errors.Is(err, ErrNoCoordinator):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrGangBroken):
		code = codes.Aborted
	case errors.Is(err, shm.ErrCorrupt):
		code = codes.DataLoss
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return status.Error(code, err.Error())
}

func unaryErrors(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	return resp, toStatus(err)
}

func streamErrors(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return toStatus(h(srv, ss))
}
