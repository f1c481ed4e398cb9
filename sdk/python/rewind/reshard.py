"""Restoring a checkpoint at another world size: Client.restore(layout=...).

Each rank of the new gang names the boxes of the global tensors it holds
now (a Slice: the global tensor's name, the box's offsets, and the tensor
or array its bytes go to, whose shape is the box's lengths). The restore
reads every saved rank's shard of the step (from this node's shared
memory, or fetched by the agent from a peer or a tier), finds the pieces
that overlap each box (tensors saved with a chunk record, by save_tensors
or rewind.dcp; a tensor saved without one is the whole global tensor, a
replicated one whose copies any rank saved), verifies each piece it reads
against its checksum once, and copies exactly the overlapping bytes. A
corrupt piece is reported to the agent, and another rank's copy of the
same piece is used when there is one; else CorruptError names the rank,
tensor and step. The objects document (non-tensor state) is the one rank
0 saved, or layout.objects_rank's. The Go SDK's Session.RestoreInto does
the same (docs/design/20261127_resharding.md).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from . import dtypes
from ._pb.agent_pb2 import ShardState
from .errors import BusyError, CorruptError, InvalidError, NotFoundError, RewindError


@dataclass
class Slice:
    """A box of global tensor name that this rank restores: offsets in
    every dimension (ints), and out, a contiguous, writable CPU torch
    tensor (a parameter too) or numpy array whose shape is the box's
    lengths and whose dtype is the saved one."""

    name: str
    offsets: Sequence[int]
    out: Any


@dataclass
class Layout:
    """What one rank of the new gang restores."""

    slices: list[Slice] = field(default_factory=list)
    objects_rank: int = 0


@dataclass
class Resharded:
    """What a restore with a layout read: the step, the world size it was
    saved at, objects_rank's objects document (UTF-8 JSON bytes, or None),
    the bytes copied into the slices, the bytes hashed to verify the
    pieces they came from, and the bytes fetched from other nodes' memory
    for shards this node lacks (the leaves the slices touch)."""

    step: int
    saved_world_size: int
    objects: bytes | None
    bytes: int = 0
    verified: int = 0
    fetched: int = 0


@dataclass
class _Piece:
    rank: int
    name: str  # the tensor's name in its shard
    offsets: tuple
    shape: tuple
    global_shape: tuple
    dtype: str


def latest_whole(c) -> int | None:
    """The newest step of which the agent holds a committed shard of every
    rank of one world size (what a lone agent, without a coordinator, can
    restore). Shards of one step at two world sizes are two gangs' saves
    of it, which a coordinator would have fenced: neither makes the other
    whole."""
    ranks: dict[tuple[int, int], set] = {}
    for s in c.list():
        if s.state == ShardState.SHARD_STATE_COMMITTED:
            ranks.setdefault((s.step, s.world_size), set()).add(s.rank)
    whole = [step for (step, world), rs in ranks.items() if rs == set(range(world))]
    return max(whole, default=None)


def restore_into(c, layout: Layout, step: int | None) -> Resharded:
    """Client.restore(layout=...), the client's lock held."""
    if step is None:
        try:
            step = c.latest_consistent()
        except BusyError:  # no coordinator: what this node holds
            step = latest_whole(c)
        if step is None:
            raise NotFoundError(f"reshard restore of job {c.job}", "the job has no step every rank committed")
    op = f"reshard restore of step {step} of job {c.job} into rank {c.rank} of {c.world_size}"
    outs = [_check(op, s) for s in layout.slices]
    shards: list = []
    try:
        # Read in parts: where the node lacks a shard, only the ranges read move.
        shards.append(c.open_shard(0, step, ranged=True))
        n = shards[0].header.meta.world_size
        for r in range(1, n):
            shards.append(c.open_shard(r, step, ranged=True))
            if shards[r].header.meta.world_size != n:
                raise CorruptError(op, f"rank {r} was saved at world size {shards[r].header.meta.world_size}, rank 0 at {n}")
        if not 0 <= layout.objects_rank < n:
            raise InvalidError(op, f"objects of rank {layout.objects_rank} asked; step {step} was saved at world size {n}")
        objects = shards[layout.objects_rank].header.objects
        res = Resharded(step, n, objects.encode("utf-8") if objects is not None else None)
        _fill(op, shards, layout.slices, outs, res)
        res.fetched = sum(sh.fetched for sh in shards)
        return res
    finally:
        for sh in shards:
            sh.close()


def _check(op: str, s: Slice) -> tuple[Any, tuple]:
    """The slice's out (a torch tensor, or a numpy array kept as such: torch
    has no unsigned types of 2 to 8 bytes) and its offsets as ints."""
    out = s.out
    if isinstance(out, np.ndarray):
        ok = out.flags.c_contiguous and out.flags.writeable
    else:
        ok = isinstance(out, torch.Tensor) and out.device.type == "cpu" and out.is_contiguous()
    if not ok:
        raise InvalidError(op, f"slice of {s.name!r}: out must be a contiguous, writable CPU tensor or numpy array")
    try:
        offs = tuple(operator.index(o) for o in s.offsets)  # numpy ints would wrap past the shape's end
    except TypeError:
        offs = None
    if offs is None or len(offs) != out.ndim or any(o < 0 for o in offs):
        raise InvalidError(op, f"slice of {s.name!r}: offsets {s.offsets!r} for a {out.ndim}-dimensional out")
    return out, offs


def _pieces(shards) -> dict[str, list[_Piece]]:
    by: dict[str, list[_Piece]] = {}
    for sh in shards:
        for t in sh.header.tensors:
            ch = t.chunk
            offs = tuple(ch["offsets"]) if ch else (0,) * len(t.shape)
            gs = tuple(ch["global_shape"]) if ch else tuple(t.shape)
            by.setdefault(t.name, []).append(_Piece(sh.header.meta.rank, t.name, offs, tuple(t.shape), gs, t.dtype))
    return by


def _fill(op: str, shards, slices: list[Slice], outs: list[tuple[Any, tuple]], res: Resharded) -> None:
    by = _pieces(shards)
    bad: set[tuple] = set()  # (rank, tensor) found corrupt
    for s, (out, offs) in zip(slices, outs):
        pieces = by.get(s.name)
        if not pieces:
            raise NotFoundError(op, f"no rank saved tensor {s.name!r} at step {res.step}")
        p0 = pieces[0]
        want = dtypes.of_ndarray(out) if isinstance(out, np.ndarray) else dtypes.of_tensor(out)
        if want != p0.dtype:
            raise InvalidError(op, f"slice of {s.name!r}: out is {want or out.dtype}, the tensor was saved as {p0.dtype}")
        lengths = tuple(out.shape)
        if any(o + n > g for o, n, g in zip(offs, lengths, p0.global_shape)) or len(lengths) != len(p0.global_shape):
            raise InvalidError(op, f"slice of {s.name!r} at {list(offs)} of {list(lengths)} is outside "
                               f"its global shape {list(p0.global_shape)}")
        groups: dict[tuple, list[_Piece]] = {}
        for p in pieces:
            if p.global_shape != p0.global_shape or p.dtype != p0.dtype:
                raise CorruptError(op, f"tensor {s.name!r}: ranks saved pieces of different global shapes or dtypes")
            if _overlap(p.offsets, p.shape, offs, lengths) is None:
                continue
            if (p.offsets, p.shape) not in groups:
                for q in groups.values():  # else the overlap counts twice, and a gap passes for covered
                    if _overlap(p.offsets, p.shape, q[0].offsets, q[0].shape) is not None:
                        raise CorruptError(op, f"tensor {s.name!r}: pieces of ranks {p.rank} and {q[0].rank} overlap "
                                           f"without being copies")
            groups.setdefault((p.offsets, p.shape), []).append(p)
        es = out.itemsize if isinstance(out, np.ndarray) else out.element_size()
        covered = 0
        for box, copies in groups.items():
            ov = _overlap(copies[0].offsets, copies[0].shape, offs, lengths)
            assert ov is not None  # grouped because it overlaps
            lo, n = ov
            p = _verified(op, shards, copies, lo, n, es, bad, res)
            sh = shards[p.rank]
            at = tuple(slice(a - po, a - po + k) for a, po, k in zip(lo, p.offsets, n)) + (Ellipsis,)
            to = tuple(slice(a - so, a - so + k) for a, so, k in zip(lo, offs, n)) + (Ellipsis,)
            if isinstance(out, np.ndarray):
                np.copyto(out[to], sh.array(p.name).reshape(p.shape)[at])
            else:
                with torch.no_grad():  # out may be a parameter
                    out[to].copy_(sh.view(p.name).view(p.shape)[at])
            vol = int(np.prod(n, dtype=np.int64))
            covered += vol
            res.bytes += vol * es
        total = int(np.prod(lengths, dtype=np.int64))
        if covered != total:  # not NotFoundError: a caller takes that for "no checkpoint: start afresh"
            raise RewindError(op, f"slice of {s.name!r} at {list(offs)} of {list(lengths)}: the saved pieces "
                              f"cover {covered} of its {total} elements")


def _overlap(offs, shape, want_offs, want_lens):
    """The intersection of two boxes as (offsets, lengths), None if empty."""
    lo = tuple(max(a, b) for a, b in zip(offs, want_offs))
    hi = tuple(min(a + n, b + m) for a, n, b, m in zip(offs, shape, want_offs, want_lens))
    if any(h <= low for low, h in zip(lo, hi)):
        return None
    return lo, tuple(h - low for low, h in zip(lo, hi))


def box_bytes(shape, offsets, lengths, es: int) -> tuple[int, int]:
    """The bytes of a row-major array of shape (element size es) that hold
    the box at offsets (relative to the array) of lengths: from its first
    element to its last, the rows between included."""
    first = last = 0
    for d in range(len(shape)):
        first = first * shape[d] + offsets[d]
        last = last * shape[d] + offsets[d] + lengths[d] - 1
    return first * es, (last + 1) * es


def _verified(op: str, shards, copies: list[_Piece], lo, n, es: int, bad: set, res: Resharded) -> _Piece:
    """The first copy of a piece whose bytes holding the box (lo, n) match:
    the leaves they touch when the agent gave the piece's leaf hashes, else
    the whole piece (OpenShard.verify_range). A corrupt copy is reported to
    its agent, which serves that shard no more. With no good copy left it
    raises CorruptError, unless a copy could not be fetched for another
    reason than its bytes (the agent out of budget, a peer gone): then an
    error of that reason's kind, for the caller to retry, not to give the
    step up."""
    problems = []
    unread: RewindError | None = None
    for p in copies:
        if (p.rank, p.name) in bad:
            continue
        try:
            rel = [a - o for a, o in zip(lo, p.offsets)]
            blo, bhi = box_bytes(p.shape, rel, n, es)
            sh = shards[p.rank]
            try:
                sh.fill([sh.tensor_range(p.name, blo, bhi)])  # a partially open shard: fetch what is read
            except RewindError as e:  # no peer served it, checked: the next copy
                bad.add((p.rank, p.name))
                problems.append(f"rank {p.rank}: {e.message}")
                if unread is None and not isinstance(e, CorruptError):
                    unread = e
                continue
            res.verified += sh.verify_range(p.name, blo, bhi)
            return p
        except CorruptError as e:
            bad.add((p.rank, p.name))
            problems.append(f"rank {p.rank}: {e.message}")
    if unread is not None:
        raise type(unread)(op, f"no copy of tensor {copies[0].name!r} could be read: " + "; ".join(problems), unread.code)
    raise CorruptError(op, "no good copy left of tensor " + repr(copies[0].name) + ": " + "; ".join(problems))


__all__ = ["Layout", "Resharded", "Slice", "box_bytes", "latest_whole", "restore_into"]
