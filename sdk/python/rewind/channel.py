"""The connection to the node's agent: a gRPC channel over its Unix socket,
dialled afresh once the agent has gone away.

grpc reconnects a channel that lost its server on its own schedule, with a
backoff of 1 s growing 1.6 times per failed attempt up to 120 s: a client
that lived through a 30 s agent outage went on failing saves for about
15 s after the agent was back, while a new client worked at once. So a
call that finds no agent (UNAVAILABLE from the transport) marks its channel
broken, and the next call dials a new one, which reaches an agent that is
back on its first attempt. The options also cap the backoff, for a channel
that lost its agent between two calls.
"""

from __future__ import annotations

import threading

import grpc

from ._pb import agent_pb2_grpc as pb_grpc
from .errors import NoAgentError, RewindError, from_rpc

OPTIONS = [
    # No bound on an answer of the node's own agent (trusted with the
    # shard's bytes already): an open's answer carries every tensor's name
    # and 1 MiB leaf hashes, 9 MiB for 20,000 tensors with long names.
    ("grpc.max_receive_message_length", -1),
    # The agent is on this node: a reconnect attempt is one connect(2) on
    # its socket, cheap enough to repeat every second for as long as it is
    # down, and an agent restarted by its supervisor within a fraction of a
    # second is found at once.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Each channel its own connection: grpc otherwise shares one among the
    # channels of a process to the same socket, backoff included, so a new
    # channel could inherit the old one's wait.
    ("grpc.use_local_subchannel_pool", 1),
]


class _Conn:
    def __init__(self, target: str):
        self.channel = grpc.insecure_channel(target, options=OPTIONS)
        self.stub = pb_grpc.AgentStub(self.channel)
        self.users = 0  # calls in flight on it
        self.broken = False  # a call found no agent: the next call dials anew
        self.retired = False  # replaced: closed when its last call returns


class AgentChannel:
    """Calls the agent's methods by name (call("Prepare", req, ...)). Safe
    for concurrent use: a channel is replaced only for calls that start
    after it broke, and closed only once no call is using it."""

    def __init__(self, socket_path: str, token: str = ""):
        self._target = "unix:" + socket_path
        # The job's token goes with every call (agent.TokenMetadata).
        self._metadata = (("rewind-job-token", token),) if token else None
        self._lock = threading.Lock()
        self._conn: _Conn | None = _Conn(self._target)

    def call(self, op: str, method: str, req, timeout: float):
        """Calls method; a failure is the matching RewindError, named op."""
        conn = self._acquire(op)
        broken = False
        try:
            return getattr(conn.stub, method)(req, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            err = from_rpc(op, e)
            broken = isinstance(err, NoAgentError)
            raise err from None
        finally:
            self._done(conn, broken)

    def call_quietly(self, method: str, req, timeout: float) -> bool:
        """Calls method for its side effect, ignoring any failure (a lease
        the agent expires anyway, a report it repeats itself)."""
        try:
            self.call(method, method, req, timeout)
            return True
        except RewindError:
            return False

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled, later ones
        fail with RewindError."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.channel.close()

    def _acquire(self, op: str) -> _Conn:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise RewindError(op, "the client is closed")
            if conn.broken:
                conn.retired = True
                if conn.users == 0:
                    conn.channel.close()
                conn = self._conn = _Conn(self._target)
            conn.users += 1
            return conn

    def _done(self, conn: _Conn, broken: bool) -> None:
        with self._lock:
            conn.users -= 1
            conn.broken = conn.broken or broken
            if conn.retired and conn.users == 0:
                conn.channel.close()
