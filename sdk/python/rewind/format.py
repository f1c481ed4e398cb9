"""The shard file format, byte for byte as the Go agent writes it (shm/format.go).

A shard is a safetensors file: an 8-byte little-endian header length, a JSON
header (tensor name -> dtype, shape, data_offsets, and ``__metadata__``, a
string-to-string map carrying rewind.* keys), padded with spaces so the data
starts on a 4096-byte boundary, then the tensors' bytes packed in order of
decreasing element size without holes. ``rewind.sum.<name>`` holds each
tensor's checksum (checksum.py) as 16 hex digits.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field

from . import checksum, dtypes
from .errors import InvalidError

ALIGNMENT = 4096
FORMAT_VERSION = "1"
MAX_HEADER_BYTES = 100 << 20
MAX_JOB_LEN = 128

META_FORMAT = "rewind.format"
META_JOB = "rewind.job"
META_RANK = "rewind.rank"
META_WORLD_SIZE = "rewind.world_size"
META_STEP = "rewind.step"
META_ALGO = "rewind.checksum"
META_OBJECTS = "rewind.objects"
META_CHUNKS = "rewind.chunks"
META_SUM_PREFIX = "rewind.sum."

_JOB_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class ShardMeta:
    """Identifies a shard."""

    job: str
    rank: int
    world_size: int
    step: int


@dataclass
class TensorInfo:
    """A tensor as placed in a shard: begin/end are byte offsets relative
    to the data section; sum is None until known."""

    name: str
    dtype: str
    shape: tuple
    begin: int = 0
    end: int = 0
    sum: int | None = None
    chunk: dict | None = None  # {"global_shape": [...], "offsets": [...]}: a piece of a sharded tensor

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def validate_job(job: str) -> None:
    """A job id is one safe path element (shm.ValidateJob)."""
    if not job:
        raise InvalidError("job", "job id is empty")
    if len(job) > MAX_JOB_LEN:
        raise InvalidError("job", f"job id {job[:20]!r}... is {len(job)} characters, the limit is {MAX_JOB_LEN}")
    if not job.isascii() or not _JOB_RE.fullmatch(job):
        raise InvalidError("job", f"job id {job!r} must start with a letter or digit and hold only letters, digits, '.', '_' and '-'")


_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_PLAIN = re.compile(r'[^"\\<>&\x00-\x1f\u2028\u2029\ud800-\udfff]*')


def go_quote(s: str) -> str:
    """A JSON string exactly as Go's json.Marshal writes it: HTML characters,
    control characters, U+2028 and U+2029 escaped, other non-ASCII raw,
    lone surrogates (invalid UTF-8 in Go) as U+FFFD."""
    if _PLAIN.fullmatch(s):
        return '"' + s + '"'
    out = []
    for ch in s:
        o = ord(ch)
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif o < 0x20 or ch in "<>&" or o in (0x2028, 0x2029):
            out.append(f"\\u{o:04x}")
        elif 0xD800 <= o < 0xE000:
            out.append("\ufffd")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class Layout:
    """The plan of a shard before its data is written (shm.NewLayout): the
    header with placeholder checksums and where each tensor goes. Build it,
    copy the data, call set_sum for every tensor, then write header at 0."""

    def __init__(self, meta: ShardMeta, specs: list[TensorInfo], objects: bytes | None):
        _check_meta(meta)
        if objects is not None:
            try:
                json.loads(objects.decode("utf-8"), parse_constant=_no_constant)
            except (UnicodeDecodeError, ValueError) as e:
                raise InvalidError("layout", f"non-tensor state is not valid UTF-8 JSON: {e}") from None
        _check_specs(specs)
        self.meta = meta
        # Stable sort by decreasing element size: every tensor is aligned to
        # its element size, with no holes between tensors.
        self.tensors = sorted((TensorInfo(s.name, s.dtype, tuple(s.shape), chunk=s.chunk) for s in specs),
                              key=lambda t: -dtypes.SIZES[t.dtype])
        off = 0
        for t in self.tensors:
            t.begin, t.end = off, off + dtypes.num_bytes(t.dtype, t.shape)
            off = t.end
        self.header = self._encode(objects)
        self.data_start = len(self.header)
        if self.data_start - 8 > MAX_HEADER_BYTES:
            raise InvalidError("layout", f"header is {self.data_start - 8} bytes, over the {MAX_HEADER_BYTES}-byte limit")
        self.size = self.data_start + off

    def _encode(self, objects: bytes | None) -> bytearray:
        m = self.meta
        kv = [(META_FORMAT, FORMAT_VERSION), (META_JOB, m.job), (META_RANK, str(m.rank)),
              (META_WORLD_SIZE, str(m.world_size)), (META_STEP, str(m.step)), (META_ALGO, checksum.ALGO)]
        if objects is not None:
            kv.append((META_OBJECTS, objects.decode("utf-8")))
        chunks = sorted((t.name, t.chunk) for t in self.tensors if t.chunk is not None)
        if chunks:  # as Go's json.Marshal writes a map: keys sorted
            kv.append((META_CHUNKS, "{" + ",".join(f"{go_quote(n)}:{_chunk_json(c)}" for n, c in chunks) + "}"))
        parts = ['{"__metadata__":{'] + [f"{go_quote(k)}:{go_quote(v)}," for k, v in kv]
        b = bytearray(8) + "".join(parts).encode()
        self._sum_pos = []
        for t in self.tensors:
            b += (go_quote(META_SUM_PREFIX + t.name) + ':"').encode()
            self._sum_pos.append(len(b))
            b += b'0000000000000000",'
        del b[-1]  # the last comma
        b += b"}"
        for t in self.tensors:
            shape = ",".join(str(d) for d in t.shape)
            b += f',{go_quote(t.name)}:{{"dtype":"{t.dtype}","shape":[{shape}],"data_offsets":[{t.begin},{t.end}]}}'.encode()
        b += b"}"
        b += b" " * (-len(b) % ALIGNMENT)
        struct.pack_into("<Q", b, 0, len(b) - 8)
        return b

    def set_sum(self, i: int, s: int) -> None:
        """Records tensor i's checksum (in data order) in the header."""
        self.tensors[i].sum = s
        p = self._sum_pos[i]
        self.header[p : p + 16] = checksum.format_sum(s).encode()

    def header_sum(self) -> str:
        """The checksum of the header bytes, for Commit."""
        return checksum.format_sum(checksum.tree_sum(self.header))


def _chunk_json(c: dict) -> str:
    gs, offs = (",".join(str(int(x)) for x in c[k]) for k in ("global_shape", "offsets"))
    return f'{{"global_shape":[{gs}],"offsets":[{offs}]}}'


def check_chunk(name: str, chunk, shape) -> None:
    """A chunk record places a piece of the given shape in its global
    tensor (shm.checkChunk): one global size and one offset per dimension,
    the piece inside."""
    try:
        gs, offs = list(chunk["global_shape"]), list(chunk["offsets"])
        ok = len(gs) == len(offs) == len(shape) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in gs + offs)
    except (TypeError, KeyError):
        ok = False
    if not ok:
        raise InvalidError("layout", f"tensor {name!r}: chunk {chunk!r} is not global_shape and offsets "
                           f"of {len(shape)} dimensions")
    if any(o < 0 or g < n or o > g - n for g, o, n in zip(gs, offs, shape)):
        raise InvalidError("layout", f"tensor {name!r}: piece {list(shape)} at {offs} does not fit in global shape {gs}")


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _check_meta(meta: ShardMeta) -> None:
    validate_job(meta.job)
    if meta.world_size <= 0 or not 0 <= meta.rank < meta.world_size:
        raise InvalidError("layout", f"rank {meta.rank} out of range for world size {meta.world_size}")
    if meta.step < 0:
        raise InvalidError("layout", f"negative step {meta.step}")


def _check_specs(specs: list[TensorInfo]) -> None:
    seen = set()
    for i, s in enumerate(specs):
        if not s.name or s.name == "__metadata__":
            raise InvalidError("layout", f"tensor {i}: invalid name {s.name!r}")
        try:
            s.name.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidError("layout", f"tensor {i}: name {s.name!r} is not valid UTF-8") from None
        if s.name in seen:
            raise InvalidError("layout", f"duplicate tensor name {s.name!r}")
        seen.add(s.name)
        if s.dtype not in dtypes.SIZES:
            raise InvalidError("layout", f"tensor {s.name!r}: unknown dtype {s.dtype!r}")
        if any(not isinstance(d, int) or d < 0 for d in s.shape):
            raise InvalidError("layout", f"tensor {s.name!r}: bad shape {list(s.shape)}")
        if s.chunk is not None:
            check_chunk(s.name, s.chunk, s.shape)


@dataclass
class Header:
    """A decoded shard header (shm.Header). meta is None for a safetensors
    file not written by rewind."""

    meta: ShardMeta | None
    tensors: list[TensorInfo]  # sorted by data offset
    metadata: dict = field(default_factory=dict)
    objects: str | None = None  # JSON of the non-tensor state
    data_start: int = 0
    size: int = 0
    # tensors by name, for the list it was built from: a load looks up
    # every item of a state dict, thousands in a large model.
    _by_name: tuple | None = field(default=None, repr=False, compare=False)

    def tensor(self, name: str) -> TensorInfo | None:
        idx = self._by_name
        if idx is None or idx[0] is not self.tensors or idx[1] != len(self.tensors):
            by_name: dict[str, TensorInfo] = {}
            for t in self.tensors:
                by_name.setdefault(t.name, t)
            idx = self._by_name = (self.tensors, len(self.tensors), by_name)
        return idx[2].get(name)
