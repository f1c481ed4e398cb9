"""Mapped shard files and tensor views over them.

A save maps the agent-prepared segment MAP_SHARED and writes into it; the
mapping is kept between saves (per path) and replaced when the agent says
the segment was resized or names another file (segment id) or size, as the
Go SDK's Session.mapSegment does: a warm save makes no system call of its
own. Segments are mapped from the file descriptors the agent passes over
its segment socket (segments.py), never opened by path. A restore maps the file read-only; torch
only builds tensors over writable buffers without a warning, so the read
mapping is exposed through a ctypes array at its address (never written:
a write would fault). A private writable mapping would do the same but is
charged in full against the overcommit limit.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np
import torch

from . import dtypes
from .format import TensorInfo


class Mapping:
    """One mapped file. ``mv`` is a memoryview of all of it."""

    def __init__(self, path: str, size: int, write: bool, fd: int | None = None):
        """Maps the file open at fd (which it closes), or else opens path."""
        if fd is None:
            flags = os.O_RDWR if write else os.O_RDONLY
            fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            if st.st_size != size:
                raise OSError(f"{path} is {st.st_size} bytes, expected {size}")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if write else 0)
            self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
        finally:
            os.close(fd)
        self.path, self.size, self.ino = path, size, st.st_ino
        if write:
            self.mv = memoryview(self.mm)
        else:
            addr = np.frombuffer(self.mm, dtype=np.uint8, count=1).ctypes.data
            self.mv = memoryview((ctypes.c_ubyte * size).from_address(addr)).cast("B")
        self.cuda_registered = False

    def address(self) -> int:
        """The mapping's address (for cudaHostRegister)."""
        t = torch.frombuffer(self.mv, dtype=torch.uint8, count=1)
        return t.data_ptr()

    def close(self) -> None:
        """Unmaps, unless views of it are still alive (then garbage
        collection unmaps it once they are gone). The memoryview is
        released first: it refuses while views exist, so the file is never
        unmapped under a live tensor."""
        if self.cuda_registered:
            from . import cuda

            cuda.unregister(self)
        try:
            self.mv.release()
            self.mm.close()
        except BufferError:
            pass


class SegmentCache:
    """Save mappings kept across saves, one per segment path."""

    def __init__(self):
        self._maps: dict[str, Mapping] = {}

    def get(self, path: str, size: int, resized: bool, segment_id: int, open_fd) -> tuple[Mapping, bool]:
        """Returns the mapping of path and whether it was newly mapped;
        open_fd() returns a writable descriptor of the segment, when a new
        mapping is needed."""
        m = self._maps.get(path)
        if m is not None:
            if not resized and segment_id and m.size == size and m.ino == segment_id:
                return m, False
            m.close()
            del self._maps[path]
        m = Mapping(path, size, write=True, fd=open_fd())
        self._maps[path] = m
        return m, True

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        self._maps.clear()


def torch_view(mv: memoryview, t: TensorInfo, data_start: int) -> torch.Tensor:
    """A flat torch tensor over tensor t's bytes in a mapping."""
    dt = dtypes.TORCH[t.dtype]
    es = dtypes.SIZES[t.dtype]
    return torch.frombuffer(mv, dtype=dt, count=t.nbytes // es, offset=data_start + t.begin)


def numpy_view(mv: memoryview, t: TensorInfo, data_start: int) -> np.ndarray:
    """A flat numpy array over tensor t's bytes in a mapping."""
    dt = dtypes.NUMPY[t.dtype]
    return np.frombuffer(mv, dtype=dt, count=t.nbytes // dt.itemsize, offset=data_start + t.begin)
