"""Reading shard files: header decoding and verification (shm/decode.go),
and load_shard, which reads a shard without any agent."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import torch

from . import checksum, copier, dtypes, placement
from . import format as fmt
from .errors import CorruptError, RewindError
from .mapping import Mapping, numpy_view, torch_view


def _corrupt(msg: str) -> CorruptError:
    return CorruptError("decode", "shard corrupt: " + msg)


def _strict(name):
    raise ValueError(f"{name} is not JSON")


def decode_header(buf, op: str = "decode") -> fmt.Header:
    """Decodes and validates the header of the shard held in buf (a
    memoryview of the whole file): known dtypes, offsets that match shapes
    and cover the data section exactly, complete rewind metadata."""
    mv = memoryview(buf).cast("B")
    size = len(mv)
    if size < 8:
        raise _corrupt(f"file is {size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", mv, 0)
    if n < 2 or n > fmt.MAX_HEADER_BYTES or n > size - 8:
        raise _corrupt(f"header length {n} invalid for a {size}-byte file")
    try:
        text = bytes(mv[8 : 8 + n]).decode("utf-8")
        if not text.startswith("{"):
            raise ValueError("header does not start with '{'")
        top, end = json.JSONDecoder(parse_constant=_strict).raw_decode(text)
        if text[end:].strip(" \t\r\n"):
            raise ValueError("garbage after the JSON header")
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError too
        raise _corrupt(f"header is not a JSON object: {e}") from None
    if not isinstance(top, dict):
        raise _corrupt("header is not a JSON object")
    h = fmt.Header(meta=None, tensors=[], data_start=8 + n, size=size)
    md = top.pop("__metadata__", None) or {}
    if not isinstance(md, dict) or not all(isinstance(v, str) for v in md.values()):
        raise _corrupt("__metadata__ is not a string-to-string map")
    h.metadata = md
    h.tensors = [_tensor(name, v) for name, v in top.items()]
    h.tensors.sort(key=lambda t: (t.begin, t.end, t.name))
    off = 0
    for t in h.tensors:
        if t.begin != off:
            raise _corrupt(f"tensor {t.name!r} starts at {t.begin}, expected {off} (hole or overlap)")
        off = t.end
    if off != size - h.data_start:
        raise _corrupt(f"tensors cover {off} bytes of a {size - h.data_start}-byte data section")
    _parse_rewind(h)
    return h


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _tensor(name: str, v) -> fmt.TensorInfo:
    if not isinstance(v, dict):
        raise _corrupt(f"tensor {name!r} is not an object")
    dt, shape, offs = v.get("dtype"), v.get("shape"), v.get("data_offsets")
    if dt not in dtypes.SIZES:
        raise _corrupt(f"tensor {name!r}: unknown dtype {dt!r}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise _corrupt(f"tensor {name!r}: bad shape {shape!r}")
    if not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs):
        raise _corrupt(f"tensor {name!r}: data_offsets must be two integers, is {offs!r}")
    want = dtypes.num_bytes(dt, shape)
    b, e = offs
    if b < 0 or e < b or e - b != want:
        raise _corrupt(f"tensor {name!r}: offsets [{b},{e}] do not fit {dt}{shape} ({want} bytes)")
    return fmt.TensorInfo(name, dt, tuple(shape), b, e)


def _parse_rewind(h: fmt.Header) -> None:
    md = h.metadata
    if not md.get(fmt.META_FORMAT):
        return
    if md[fmt.META_FORMAT] != fmt.FORMAT_VERSION:
        raise _corrupt(f"unsupported {fmt.META_FORMAT} {md[fmt.META_FORMAT]!r}")
    try:
        job = md.get(fmt.META_JOB, "")
        fmt.validate_job(job)
        rank, ws, step = (int(md.get(k, "x")) for k in (fmt.META_RANK, fmt.META_WORLD_SIZE, fmt.META_STEP))
    except Exception as e:
        raise _corrupt(f"bad job/rank/world size/step: {e}") from None
    if ws <= 0 or not 0 <= rank < ws or step < 0:
        raise _corrupt(f"bad rank/world size/step {rank}/{ws}/{step}")
    h.meta = fmt.ShardMeta(job, rank, ws, step)
    if md.get(fmt.META_ALGO) != checksum.ALGO:
        raise _corrupt(f"unknown checksum {md.get(fmt.META_ALGO)!r}")
    h.objects = md.get(fmt.META_OBJECTS)
    if fmt.META_CHUNKS in md:
        try:
            for name, ch in json.loads(md[fmt.META_CHUNKS]).items():
                t = h.tensor(name)
                if t is None:
                    raise ValueError(f"chunk of no tensor {name!r}")
                fmt.check_chunk(name, ch, t.shape)
                t.chunk = ch
        except Exception as e:
            raise _corrupt(f"{fmt.META_CHUNKS}: {e}") from None
    for t in h.tensors:
        s = md.get(fmt.META_SUM_PREFIX + t.name, "")
        if len(s) != 16 or any(c not in "0123456789abcdefABCDEF" for c in s):
            raise _corrupt(f"tensor {t.name!r}: checksum {s!r} missing or malformed")
        t.sum = int(s, 16)
    names = {t.name for t in h.tensors}
    for k in md:
        if k.startswith(fmt.META_SUM_PREFIX) and k[len(fmt.META_SUM_PREFIX) :] not in names:
            raise _corrupt(f"checksum for unknown tensor {k[len(fmt.META_SUM_PREFIX):]!r}")


def check_sums(h: fmt.Header, sums: list[int], op: str = "verify") -> None:
    """Compares computed sums (in h.tensors order) with the recorded ones."""
    for t, s in zip(h.tensors, sums):
        if t.sum is None:
            raise CorruptError(op, f"tensor {t.name!r} has no checksum")
        if s != t.sum:
            where = f" (step {h.meta.step}, rank {h.meta.rank})" if h.meta else ""
            raise CorruptError(op, f"tensor {t.name!r}{where}: checksum {checksum.format_sum(s)}, "
                               f"header says {checksum.format_sum(t.sum)}")


def verify(h: fmt.Header, buf, workers: int = 0) -> None:
    """Checks every tensor checksum of the shard held in buf."""
    mv = memoryview(buf).cast("B")
    ts = [copier.Transfer(h.data_start + t.begin, t.nbytes) for t in h.tensors]
    check_sums(h, copier.copy_and_sum(mv, ts, workers))


def copy_out(m: Mapping, h: fmt.Header, device="cpu", workers: int = 0, numpy_names=(), verify: bool = True,
             op: str = "restore", locations: dict | None = None) -> dict:
    """Copies every tensor of a mapped shard into fresh tensors, verifying
    the checksums in the same pass (unless verify is false). device is a
    map_location (placement.py) applied to each tensor's saved location
    (locations: name -> "cuda:0", the CPU when absent). Tensors named in
    numpy_names, and those of a dtype this torch lacks, come back as numpy
    arrays."""
    place = placement.Placement(device, op)
    locations = locations or {}
    out: dict[str, np.ndarray | torch.Tensor] = {}
    transfers: list[copier.Transfer] = []
    for t in h.tensors:
        tr = copier.Transfer(h.data_start + t.begin, t.nbytes)
        if t.name in numpy_names or t.dtype not in dtypes.TORCH:
            arr = np.empty(t.shape, dtype=dtypes.NUMPY[t.dtype])
            if t.nbytes:
                tr.copy_all = _np_copier(arr, numpy_view(m.mv, t, h.data_start))
            out[t.name] = arr
        else:
            dev = place.device(t.name, locations.get(t.name, "cpu"))
            try:
                dst = torch.empty(t.shape, dtype=dtypes.TORCH[t.dtype], device=dev)
            except (RuntimeError, AssertionError, TypeError) as e:
                raise RewindError(op, f"tensor {t.name!r} on {dev}: {e}") from None
            if t.nbytes:
                src = torch_view(m.mv, t, h.data_start)
                _set_restore_copy(tr, dst, src, dtypes.SIZES[t.dtype], dev.type == "cpu")
            out[t.name] = dst
        transfers.append(tr)
    try:
        sums = copier.copy_and_sum(m.mv, transfers, workers)
    except (RuntimeError, AssertionError, TypeError) as e:  # a device's copy
        raise RewindError(op, f"copying out of {m.path}: {e}") from None
    if verify:
        check_sums(h, sums, op)
    if place.fn is not None:
        for name, v in out.items():
            if isinstance(v, torch.Tensor):
                out[name] = place.relocate(name, v, locations.get(name, "cpu"))
    return out


def _np_copier(dst: np.ndarray, src: np.ndarray):
    return lambda: np.copyto(dst.reshape(-1), src)


def _set_restore_copy(tr: copier.Transfer, dst: torch.Tensor, src: torch.Tensor, es: int, cpu: bool) -> None:
    flat = dst.view(-1)
    if cpu:
        tr.copy_leaf = lambda a, b: flat[a // es : b // es].copy_(src[a // es : b // es])
    else:  # the bytes are hashed from the mapping after one whole copy
        tr.copy_all = lambda: flat.copy_(src)


def load_shard(path: str, *, verify: bool = True, map_location="cpu", workers: int = 0):
    """Reads a shard file (safetensors) into tensors, without any agent:
    for a checkpoint copied out of shared memory, a tier or S3 by hand.
    Returns (header, {name: tensor}); header.meta holds job, rank, world
    size and step (None for a plain safetensors file) and header.objects
    the JSON of the non-tensor state. With verify (the default) every
    checksum is checked and a mismatch raises CorruptError. Tensors of a
    dtype this torch lacks come back as numpy arrays."""
    return _load(path, verify, map_location, workers, False)


def load_state(path: str, *, verify: bool = True, map_location="cpu", workers: int = 0):
    """Reads a shard file saved by the Python SDK, without any agent, and
    returns (step, state): the nest that was given to Client.save."""
    from . import state

    h, tensors = _load(path, verify, map_location, workers, True)
    return (h.meta.step if h.meta else None), state.unflatten(h.objects, tensors, f"load {path}")


def _load(path: str, verify: bool, map_location, workers: int, numpy_from_objects: bool):
    from . import state

    op = f"load {path}"
    size = os.stat(path).st_size
    m = Mapping(path, size, write=False)
    try:
        try:
            h = decode_header(m.mv)
        except CorruptError as e:
            raise CorruptError(op, e.message) from None
        names = state.numpy_names(h.objects) if numpy_from_objects else ()
        tensors = copy_out(m, h, map_location, workers, names, verify=verify and h.meta is not None, op=op,
                           locations=state.devices(h.objects))
    finally:
        m.close()
    return h, tensors
