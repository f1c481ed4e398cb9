"""How rewind.dcp's Reader rebuilds DCP's global Metadata from the shards:
each saved rank's shard header (its tensors' chunk records and the
rewind.dcp document in its objects) adds that rank's pieces; a step whose
shards come from two saves of it is refused."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from .client import Client, OpenShard
from .dtypes import TORCH
from .errors import CorruptError, NotFoundError, RewindError

DOC_FORMAT = "rewind.dcp/1"


@dataclass(frozen=True)
class Stored:
    """Where a DCP item is: the shard tensor name in rank's shard (the
    storage_data of WriteResult and Metadata)."""

    rank: int
    name: str


def check_one_save(c: Client, step: int, saves: list) -> None:
    """Refuses a step whose shards (the newest copy of each rank's) come
    from different saves of it: a save of a step saved before that failed
    after some ranks committed. Loaded, it would be a state of two saves,
    a DTensor's rows from one and the rest from the other."""
    if len(set(saves)) <= 1:
        return
    groups: dict = {}
    for r, s in enumerate(saves):
        groups.setdefault(s, []).append(r)
    ranks = "; ".join(f"ranks {', '.join(map(str, rs))}: save {s or '(none)'}" for s, rs in groups.items())
    raise NotFoundError(f"dcp load step {step} of job {c.job}",
                        f"its shards come from {len(groups)} saves of the step ({ranks}): a save of the step "
                        "failed after some ranks committed; load another step (Reader(step=N))")


def check_covered(c: Client, step: int, sdm: dict) -> None:
    """Refuses a step in which a tensor's saved pieces do not cover it:
    DCP reads only the pieces that overlap what a rank loads, so a gap
    would load as whatever the target held. A save by processes that each
    planned alone (dcp.save with no_dist=True in a gang: every process
    saves as rank 0 of 1) leaves one; so does a shard that lost a piece."""
    for fqn, md in sdm.items():
        if not isinstance(md, TensorStorageMetadata):
            continue
        total = _volume(md.size)
        covered = 0
        pieces = {(tuple(ch.offsets), tuple(ch.sizes)): ch for ch in md.chunks}  # a replica counts once
        for ch in pieces.values():
            if len(ch.offsets) != len(md.size) or any(
                    o < 0 or n < 0 or o + n > s for o, n, s in zip(ch.offsets, ch.sizes, md.size)):
                raise CorruptError(f"dcp load step {step} of job {c.job}",
                                   f"tensor {fqn!r}: a piece at {list(ch.offsets)} of {list(ch.sizes)} lies outside "
                                   f"its global shape {list(md.size)}")
            covered += _volume(ch.sizes)
        if covered < total:
            raise NotFoundError(f"dcp load step {step} of job {c.job}",
                                f"tensor {fqn!r}: its saved pieces hold {covered} of its {total} elements "
                                f"(global shape {list(md.size)}): the step is not a whole checkpoint of it (saved "
                                "by processes that each planned alone, as dcp.save with no_dist=True does?)")


def _volume(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def index_shard(sh: OpenShard, rank: int, sdm: dict, stored: dict, sizes: dict, dtypes: dict):
    """Adds one saved rank's shard to the metadata being rebuilt; returns
    its planner_data (None when it has none) and its save id (None for a
    shard written before save ids)."""
    h = sh.header
    op = f"dcp load step {sh.shard.step} rank {rank}"
    try:
        doc = json.loads(h.objects or "null")
        if not isinstance(doc, dict) or doc.get("format") != DOC_FORMAT:
            raise ValueError(f"not a {DOC_FORMAT} document")
        items = doc["items"]
        for t in h.tensors:
            it = items[t.name]
            fqn = it["fqn"]
            st = Stored(rank, t.name)
            if it["kind"] == "bytes":
                _merge(sdm, fqn, BytesStorageMetadata())
                stored[MetadataIndex(fqn)] = st
                continue
            ch = t.chunk
            if ch is None:
                raise ValueError(f"tensor {t.name!r} has no chunk record")
            dtype, shape, offsets, piece = TORCH[t.dtype], ch["global_shape"], ch["offsets"], tuple(t.shape)
            if "dtype" in it:  # stored as its bytes (U8), a trailing dimension of its element size
                dtype = _byte_dtype(it["dtype"], t, ch)
                dtypes[st] = dtype
                shape, offsets, piece = shape[:-1], offsets[:-1], piece[:-1]
            props = TensorProperties(dtype=dtype, requires_grad=bool(it.get("requires_grad")))
            md = _merge(sdm, fqn, TensorStorageMetadata(props, torch.Size(shape), []))
            md.chunks.append(ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(piece)))
            stored[MetadataIndex(fqn, offsets)] = st
            sizes[st] = piece
        pd = doc.get("planner_data")
        save = doc.get("save")
        if save is not None and not isinstance(save, str):
            raise ValueError(f"save id {save!r} is not a string")
        return None if pd is None else {k: tuple(v) for k, v in pd.items()}, save
    except (KeyError, TypeError, ValueError) as e:
        raise RewindError(op, f"the shard is not a DCP checkpoint's ({type(e).__name__}: {e})") from None


def _byte_dtype(name, t, ch) -> torch.dtype:
    """The dtype of a piece stored as its bytes, checked against them."""
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    try:
        probe = torch.empty(0, dtype=dtype) if isinstance(dtype, torch.dtype) else None
    except (RuntimeError, TypeError):  # a quantized dtype, one torch makes no plain tensor of
        probe = None
    if probe is None or probe.is_quantized:
        raise ValueError(f"tensor {t.name!r}: dtype {name!r} is not one a piece of this torch is stored as")
    es = probe.element_size()
    if t.dtype != "U8" or not t.shape or t.shape[-1] != es or ch["global_shape"][-1:] != [es] or ch["offsets"][-1:] != [0]:
        raise ValueError(f"tensor {t.name!r}: {name} stored as {t.dtype} {list(t.shape)}, not as its {es}-byte elements")
    return probe.dtype


def _merge(sdm: dict, fqn: str, md):
    have = sdm.setdefault(fqn, md)
    if type(have) is not type(md) or (isinstance(md, TensorStorageMetadata) and (
            have.size != md.size or have.properties.dtype != md.properties.dtype)):
        raise ValueError(f"{fqn}: pieces of different kinds, global shapes or dtypes")
    return have
