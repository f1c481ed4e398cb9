"""Exceptions raised by the rewind SDK.

Every failure is a RewindError; its subclasses say what kind of failure it
was, the way the Go SDK's errors wrap ErrNotFound, ErrCorrupt and so on.
The message names the operation and carries the agent's own words.
"""

from __future__ import annotations

import grpc


class RewindError(Exception):
    """A failed rewind call. ``op`` names the operation ("save step 12 of
    job j rank 0"), ``message`` what went wrong, ``code`` the gRPC status
    code when the agent answered with one."""

    def __init__(self, op: str, message: str, code: grpc.StatusCode | None = None):
        super().__init__(f"rewind: {op}: {message}")
        self.op = op
        self.message = message
        self.code = code

    def __reduce__(self):
        # Pickled with the constructor's own arguments: an exception
        # pickles its args, here the one formatted string, which the
        # constructor would refuse. DCP pickles a rank's exception to every
        # other rank (all_gather_object), multiprocessing a worker's.
        return (type(self), (self.op, self.message, self.code), self.__dict__)


class NoAgentError(RewindError):
    """No agent answers on the socket, or it went away mid-call."""


class NotFoundError(RewindError):
    """The agent holds no checkpoint for this job, rank (and step)."""


class ResourceExhaustedError(RewindError):
    """The shard does not fit the agent's shared-memory budget or tmpfs."""


class CorruptError(RewindError):
    """A shard's bytes do not match its checksums. The agent has been told
    and never serves that shard again; the next restore gets an older step."""


class InvalidError(RewindError):
    """Bad input: job id, rank, step, or state the SDK cannot store."""


class BusyError(RewindError):
    """The slot is not available: a later save took it over, say."""


class DeadlineError(RewindError, TimeoutError):
    """The agent did not answer within the call's timeout."""


class CoordinatorUnavailableError(RewindError):
    """The agent answered, but the coordinator behind it did not."""


class PermissionDeniedError(RewindError):
    """The agent isolates jobs, and the client's job token is missing or
    not the job's (REWIND_JOB_TOKEN, REWIND_JOB_TOKEN_FILE, token=)."""


class GangBrokenError(RewindError):
    """The coordinator is recovering the job after losing a node: this rank
    must stop (its peers are gone) and exit; the job is restarted and
    restores the step the message names."""


_KINDS = {
    grpc.StatusCode.UNAVAILABLE: NoAgentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.DATA_LOSS: CorruptError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidError,
    grpc.StatusCode.FAILED_PRECONDITION: BusyError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineError,
    grpc.StatusCode.ABORTED: GangBrokenError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}

_CODES = {c.value[0]: c for c in grpc.StatusCode}


def from_code(op: str, code: int, msg: str) -> RewindError:
    """The RewindError of a gRPC status code given as its number (the
    segment socket's answers)."""
    sc = _CODES.get(code)
    return _KINDS.get(sc, RewindError)(op, msg, sc)


def from_rpc(op: str, err: grpc.RpcError) -> RewindError:
    """Turns a gRPC error into the matching RewindError, in one place."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else None
    msg = details or str(err)
    kind = _KINDS.get(code, RewindError)
    if code == grpc.StatusCode.UNAVAILABLE and msg.startswith("agent: coordinator"):
        kind = CoordinatorUnavailableError
    elif code == grpc.StatusCode.UNAVAILABLE:
        msg = "agent unavailable: " + msg
    return kind(op, msg, code)
