"""Saving CUDA tensors: the shard mapping is registered as pinned host
memory (cudaHostRegister) so device-to-host copies are DMA transfers, the
copies are issued non-blocking on a side stream per device, and the save
waits for them (stream.synchronize) before hashing the copied bytes and
committing: a save never returns before its bytes are in shared memory.

Everything here runs only when torch.cuda.is_available(); its tests
(tests/test_cuda.py) pass on an NVIDIA H200 (torch 2.11, CUDA 13) and are
skipped without a GPU.
"""

from __future__ import annotations

import warnings

import torch

from .mapping import Mapping


def available() -> bool:
    return torch.cuda.is_available()


def _ok(err) -> bool:
    return int(getattr(err, "value", err)) == 0


def pin(address: int, size: int, what: str, stacklevel: int = 2) -> bool:
    """Page-locks size bytes at address for DMA (cudaHostRegister); on
    failure copies still work, through pageable memory (slower), and a
    warning naming what says so."""
    err = torch.cuda.cudart().cudaHostRegister(address, size, 0)  # cudaHostRegisterDefault
    if not _ok(err):
        warnings.warn(f"rewind: cudaHostRegister of {size} bytes ({what}) failed ({err}); "
                      "GPU tensors are copied through pageable memory", RuntimeWarning, stacklevel=stacklevel + 1)
        return False
    return True


def unpin(address: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(address)


def register(m: Mapping) -> bool:
    """Pins a mapping for DMA once (pin)."""
    if not m.cuda_registered:
        m.cuda_registered = pin(m.address(), m.size, f"the mapping of {m.path}", stacklevel=3)
    return m.cuda_registered


def unregister(m: Mapping) -> None:
    if m.cuda_registered:
        unpin(m.address())
        m.cuda_registered = False


class SideStreams:
    """One copy stream per device, kept for the client's life."""

    def __init__(self):
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._pending: list[torch.cuda.Stream] = []

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Issues dst.copy_(src) on src's device's side stream, after the
        work already queued on its current stream (which produced src)."""
        dev = src.device
        s = self._streams.get(dev)
        if s is None:
            s = self._streams[dev] = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            dst.copy_(src, non_blocking=True)
        if s not in self._pending:
            self._pending.append(s)

    def wait(self) -> None:
        """Blocks until every issued copy has landed in host memory."""
        while self._pending:
            self._pending.pop().synchronize()
