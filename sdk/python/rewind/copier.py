"""Copy tensors to or from a mapped shard and checksum them in one pass.

The Python twin of shm.CopyAndSum: every tensor's bytes are cut into 1 MiB
leaves; a contiguous tensor is copied leaf by leaf with torch's copy_ and
each leaf is hashed from the shard's memoryview right after it is copied,
while it is still in cache. Both copy_ and xxhash release the GIL, so the
leaves are spread over a few threads, in contiguous runs of roughly equal
bytes. A tensor that cannot be cut (non-contiguous, numpy, on a GPU) is
copied whole by one thread and then hashed.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Tuple

from .checksum import LEAF_SIZE, leaf_hash, num_leaves, root

# Below this many bytes the copy runs on the calling thread: handing work
# to other threads costs more than it saves.
PARALLEL_MIN = 8 << 20


def default_workers() -> int:
    """The copy is bound by memory bandwidth, which two to four cores
    saturate; a training process needs its other cores."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 4))


@dataclass
class Transfer:
    """One tensor's part of a copy. offset/nbytes place its bytes in the
    shard mapping. copy_leaf(a, b) copies bytes [a, b) of the tensor (a is
    leaf-aligned); copy_all() copies it whole. Neither set: hash only.
    late transfers are done after all others (GPU copies in flight: their
    copy_all waits for them)."""

    offset: int
    nbytes: int
    copy_leaf: Callable[[int, int], object] | None = None  # what it returns is not used
    copy_all: Callable[[], object] | None = None
    late: bool = False


# A unit of copy work: (weight, transfer index, first leaf, end leaf).
Unit = Tuple[int, int, int, int]

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rewind-copy")
        return _pool


def copy_and_sum(mv: memoryview, transfers: list[Transfer], workers: int = 0) -> list[int]:
    """Runs every transfer and returns each tensor's checksum, in order."""
    workers = workers or default_workers()
    leaves = [[0] * num_leaves(t.nbytes) for t in transfers]
    units: list[Unit] = []
    late: list[Unit] = []
    for ti, t in enumerate(transfers):
        n = len(leaves[ti])
        if t.copy_leaf is not None:
            units.extend((LEAF_SIZE, ti, i, i + 1) for i in range(n))
        else:
            (late if t.late else units).append((t.nbytes, ti, 0, n))
    units += late

    def run(group: list[Unit]) -> None:
        for _, ti, lo, hi in group:
            t = transfers[ti]
            if t.copy_all is not None and t.nbytes:
                t.copy_all()
            for i in range(lo, hi):
                a = i * LEAF_SIZE
                b = min(a + LEAF_SIZE, t.nbytes)
                if t.copy_leaf is not None:
                    t.copy_leaf(a, b)
                leaves[ti][i] = leaf_hash(mv[t.offset + a : t.offset + b])

    total = sum(t.nbytes for t in transfers)
    groups = _partition(units, workers if total >= PARALLEL_MIN else 1)
    if len(groups) > 1:
        pool = _executor(len(groups) - 1)
        futures = [pool.submit(run, g) for g in groups[1:]]
        try:
            run(groups[0])
        finally:
            for f in futures:
                f.exception()  # wait for all before anything is unmapped
        for f in futures:
            f.result()
    elif groups:
        run(groups[0])
    return [root(ls) for ls in leaves]


def _partition(units: list[Unit], n: int) -> list[list[Unit]]:
    """Cuts units into at most n consecutive runs of roughly equal weight."""
    if n <= 1 or len(units) <= 1:
        return [units] if units else []
    total = sum(u[0] for u in units)
    groups: list[list[Unit]] = []
    cur: list[Unit] = []
    acc = 0
    for u in units:
        cur.append(u)
        acc += u[0]
        if acc >= total * (len(groups) + 1) / n and len(groups) < n - 1:
            groups.append(cur)
            cur = []
    if cur:
        groups.append(cur)
    return groups
