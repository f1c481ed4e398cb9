package sdk

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Kinds of failure, for errors.Is.
var (
	// ErrNoAgent: no agent answers on the socket. The client's next call
	// dials it anew, so once the agent is back the next call succeeds.
	ErrNoAgent           = errors.New("no agent")
	ErrNotFound          = errors.New("not found")
	ErrResourceExhausted = errors.New("out of shared memory or budget")
	ErrCorrupt           = errors.New("checkpoint corrupt")
	ErrInvalid           = errors.New("invalid argument")
	ErrBusy              = errors.New("slot busy")
	ErrTimeout           = errors.New("deadline exceeded")
	// ErrCoordinatorUnavailable: the agent answered, the coordinator
	// behind it did not.
	ErrCoordinatorUnavailable = errors.New("coordinator unavailable")
	// ErrGangBroken: the coordinator is recovering the job after losing a
	// node. The rank must stop (its peers are gone) and exit; the job is
	// restarted and restores the step the message names.
	ErrGangBroken = errors.New("gang broken")
	// ErrPermission: the agent isolates jobs and the client's job token
	// is missing or not the job's.
	ErrPermission = errors.New("permission denied")
)

// Error is a failed SDK call.
type Error struct {
	Op   string // "save step 12", "restore", ...
	Msg  string // what went wrong, the agent's own words where it answered
	kind error
}

func (e *Error) Error() string { return fmt.Sprintf("rewind: %s: %s", e.Op, e.Msg) }

// Unwrap returns the kind of failure (ErrNotFound, ErrCorrupt, ...), or nil.
func (e *Error) Unwrap() error { return e.kind }

// wrap turns an agent error into an *Error naming the operation.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return &Error{Op: op, Msg: err.Error()}
	}
	kinds := map[codes.Code]error{
		codes.Unavailable:        ErrNoAgent,
		codes.NotFound:           ErrNotFound,
		codes.ResourceExhausted:  ErrResourceExhausted,
		codes.DataLoss:           ErrCorrupt,
		codes.InvalidArgument:    ErrInvalid,
		codes.FailedPrecondition: ErrBusy,
		codes.DeadlineExceeded:   ErrTimeout,
		codes.Aborted:            ErrGangBroken,
		codes.PermissionDenied:   ErrPermission,
	}
	msg, kind := st.Message(), kinds[st.Code()]
	switch {
	case st.Code() == codes.Unavailable && strings.HasPrefix(msg, "agent: coordinator"):
		kind = ErrCoordinatorUnavailable
	case st.Code() == codes.Unavailable:
		msg = "agent unavailable: " + msg
	}
	return &Error{Op: op, Msg: msg, kind: kind}
}
