"""The agent's segment socket: how a rank gets a segment's file descriptor.

The shared-memory root is the agent's alone; a rank asks for a segment over
a SOCK_SEQPACKET Unix socket beside the gRPC one (its path with ".seg"
appended): one SegmentRequest per packet, answered by one SegmentResponse
packet with the segment's descriptor attached (SCM_RIGHTS) when the agent
grants it — writable for the slot a Prepare gave this rank (its token),
read-only for a shard this rank holds a lease on. The Go SDK's
sdk/segments.go and the agent's agent/segserver.go speak the same wire.
"""

from __future__ import annotations

import os
import socket
import threading

from ._pb import agent_pb2 as pb
from .errors import NoAgentError, RewindError, from_code

SUFFIX = ".seg"
MAX_PACKET = 8 << 10


class SegmentSocket:
    """A connection to the segment socket, dialled at first use and kept;
    one request at a time (thread-safe)."""

    def __init__(self, agent_socket: str, token: str):
        self.path = agent_socket + SUFFIX
        self._token = token
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def open(self, op: str, req: pb.SegmentRequest, timeout: float) -> tuple[int, pb.SegmentResponse]:
        """Returns (descriptor, answer); the caller closes the descriptor.
        A refusal raises the RewindError of its code, naming why."""
        req.job_token = self._token
        packet = req.SerializeToString()
        with self._lock:
            # A kept connection may belong to an agent that has since
            # restarted: on failure it is dialled anew, once (asking for a
            # descriptor twice is harmless).
            for fresh in (self._sock is None, True):
                try:
                    data, fds = self._exchange(packet, timeout)
                    break
                except OSError as e:
                    self._drop()
                    if fresh:
                        raise NoAgentError(op, f"segment socket {self.path}: {e}") from None
        resp = pb.SegmentResponse()
        try:
            resp.ParseFromString(data)
        except Exception as e:  # protobuf's DecodeError
            _close(fds)
            raise RewindError(op, f"segment socket {self.path}: undecodable answer: {e}") from None
        if resp.code != 0:
            _close(fds)
            raise from_code(op, resp.code, resp.error)
        if len(fds) != 1:
            _close(fds)
            raise RewindError(op, f"segment socket {self.path}: the agent granted a segment with {len(fds)} descriptors, not one")
        return fds[0], resp

    def _exchange(self, packet: bytes, timeout: float) -> tuple[bytes, list[int]]:
        if self._sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                s.settimeout(timeout)
                s.connect(self.path)
            except OSError:
                s.close()
                raise
            self._sock = s
        self._sock.settimeout(timeout)
        self._sock.sendall(packet)
        data, fds, _, _ = socket.recv_fds(self._sock, MAX_PACKET + 1, 4)
        if not data:
            _close(fds)
            raise ConnectionResetError("the agent closed the connection")
        return data, fds

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        with self._lock:
            self._drop()


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
