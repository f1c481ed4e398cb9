"""rewind.dcp against DCP's own FileSystemWriter and FileSystemReader, in
one process (no process group): for each state dict of the matrix, what
a save and a load through the file system give, rewind must give too:
the same values, bit for bit (and the values saved), or, where the file
system fails, a failure. A dtype safetensors has no name for is stored
as its bytes and loads the same. A step before any failed save still
loads.

Needs torch 2.x (make test-python-dcp runs it in a Debian trixie root)."""

from __future__ import annotations

import dataclasses
import io
import math
from typing import Callable

import pytest

pytest.importorskip("torch.distributed.checkpoint.metadata", reason="needs torch 2.x")
try:
    import rewind.dcp
except ImportError as e:
    pytest.skip(f"rewind.dcp: {e}", allow_module_level=True)

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import rewind  # noqa: E402


@dataclasses.dataclass
class Point:
    """A user's own class in a state dict (pickled by DCP)."""

    x: int
    label: str


def rand(shape, dtype, salt: int, seed: int = 0) -> torch.Tensor:
    """Seeded values of dtype for salt; zeros for salt 0 (a template)."""
    if not salt:
        return torch.zeros(shape, dtype=dtype)
    g = torch.Generator().manual_seed(seed * 7919 + salt)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    lo, hi = (0, 250) if dtype in (torch.uint8,) or "uint" in str(dtype) else (-120, 120)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def _opt(name: str):
    return getattr(torch, name, None)


# Every dtype a shard holds, one key each (torch 2.6 has them all).
HELD = ["bfloat16", "float16", "float32", "float64", "bool", "int8", "uint8", "int16", "int32", "int64",
        "complex64", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"]


def dtypes_case(salt: int) -> dict:
    return {n: rand((3, 5), _opt(n), salt, i) for i, n in enumerate(HELD) if _opt(n) is not None}


def shapes_case(salt: int) -> dict:
    return {
        "scalar": rand((), torch.float32, salt, 1),
        "scalar_bool": rand((), torch.bool, salt, 2),
        "scalar_i64": rand((), torch.int64, salt, 3),
        "empty": torch.empty(0),
        "empty_mid": torch.empty(3, 0, 2, dtype=torch.float16),
        "ones": rand((1, 1, 1), torch.float64, salt, 4),
        # Spans several of the 1 MiB leaves a load checks one by one.
        "big": rand((700, 1000), torch.float32, salt, 5),
    }


def layouts_case(salt: int) -> dict:
    """Tensors whose memory is not one dense run: DCP hands them over as
    they are."""
    base = rand((6, 8), torch.float32, salt, 10)
    c = rand((4, 3), torch.complex64, salt, 11)
    img = rand((2, 3, 4, 5), torch.float32, salt, 12)
    return {
        "transposed": base.t(),
        "cols": base[:, 1::3],
        "offset": base.reshape(-1)[5:17],
        "expanded": rand((5,), torch.float32, salt, 13).expand(4, 5),
        "overlapping": torch.as_strided(rand((10,), torch.int32, salt, 14), (4, 3), (1, 1)),
        "permuted": rand((3, 4, 5), torch.float64, salt, 15).permute(2, 0, 1)[1:, :, ::2],
        "channels_last": img.contiguous(memory_format=torch.channels_last),
        "conj": c.conj(),  # a lazy conjugate: its memory holds c
        "neg": c.conj().imag,  # a lazy negation
        "param": torch.nn.Parameter(rand((3,), torch.float32, salt, 16)),
    }


def shared_case(salt: int) -> dict:
    """Keys that are views of one storage, and one tensor under two keys."""
    base = rand((12,), torch.float32, salt, 20)
    t = rand((4,), torch.float32, salt, 21)
    return {"whole": base, "head": base[:6], "mid": base[3:9], "again": t, "same": t}


KEYS = [
    "k" * 5000,  # longer than any file name
    "模型.层/权重 ünï",
    "a/b/c", "with space", 'quo"te', "back\\slash", "new\nline", "tab\t", "<html>&amp;", "line\u2028sep",
    "w#1", "w@0", "w@2,3", "#", "@",
    "",  # the empty key
    "__metadata__",  # safetensors' reserved name
]


def keys_case(salt: int) -> dict:
    return {k: rand((2,), torch.float32, salt, i) for i, k in enumerate(KEYS)} | {"w": rand((4,), torch.float32, salt, 99)}


def nested_case(salt: int) -> dict:
    return {
        "a": {"b": {"c": rand((2,), torch.float32, salt, 30)}, "b.d": rand((2,), torch.float32, salt, 31)},
        "lst": [rand((2,), torch.float32, salt, 32), rand((3,), torch.int64, salt, 33)],
        "deep": {"x": [{"y": rand((1,), torch.float32, salt, 34)}, 5 * salt]},
    }


def int_key_case(salt: int) -> dict:
    """A non-str key: the file system loads it up to torch 2.6; from 2.14
    DCP's load fails on it (it sorts int and str keys together)."""
    return {"a": rand((2,), torch.float32, salt, 36), 7: rand((2,), torch.float32, salt, 35)}


def objects_case(salt: int) -> dict:
    return {
        "int": 3 * salt, "float": 0.5 * salt, "nan": math.nan if salt else 0.0, "str": "s" * salt, "none": None,
        "bool": bool(salt), "bytes": b"\x00\xff" * salt, "buf": io.BytesIO(b"buffered %d" % salt),
        "big_bytes": bytes(range(256)) * (20000 * salt + 1), "set": {salt, 2}, "tuple": (salt, "t"),
        "size": torch.Size([salt, 2]), "point": Point(salt, "p"), "rng": torch.Generator().manual_seed(salt).get_state(),
        "np": __import__("numpy").arange(4) * salt,
    }


def adamw_case(salt: int) -> dict:
    """A model and AdamW after one step, as get_state_dict gives them."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(salt)  # the template (salt 0) has other values, and the same keys
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01 * (salt + 1), weight_decay=0.1)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


SAME: dict[str, Callable[[int], dict]] = {
    "dtypes": dtypes_case, "shapes": shapes_case, "layouts": layouts_case, "shared": shared_case,
    "keys": keys_case, "nested": nested_case, "objects": objects_case, "adamw": adamw_case,
}


def zeros_template(make: Callable[[int], dict]) -> dict:
    """The state to load into: the structure of make(0), every tensor a
    plain zero tensor of the saved shape and dtype."""
    def z(v):
        if isinstance(v, dict):
            return {k: z(x) for k, x in v.items()}
        if isinstance(v, list):
            return [z(x) for x in v]
        if isinstance(v, torch.Tensor):
            return torch.zeros(v.shape, dtype=v.dtype)
        return v
    return z(make(0))


def comparable(v):
    """A value that compares equal exactly when the two values are the
    same, bit for bit (NaNs included)."""
    if isinstance(v, torch.Tensor):
        v = v.detach()
        if v.is_sparse:
            return ("sparse", comparable(v.to_dense()))
        flat = v.resolve_conj().resolve_neg().contiguous().reshape(-1)
        return ("tensor", str(v.dtype), tuple(v.shape), bytes(flat.view(torch.uint8).numpy()))
    if isinstance(v, io.BytesIO):
        return ("BytesIO", v.getvalue())
    if isinstance(v, float):
        return ("float", repr(v))
    if isinstance(v, tuple):
        return (type(v).__name__, tuple(comparable(x) for x in v))
    if type(v).__module__ == "numpy":
        return ("numpy", repr(v.dtype), v.shape, v.tobytes())
    return (type(v).__name__, v)


def flat(d, prefix: str = "") -> dict:
    out = {}
    items = d.items() if isinstance(d, dict) else enumerate(d)
    for k, v in items:
        key = f"{prefix}{k!r}"
        if isinstance(v, (dict, list)):
            out.update(flat(v, key + "/"))
        else:
            out[key] = comparable(v)
    return out


@dataclasses.dataclass
class Outcome:
    """What a save and a load through one storage gave: the loaded state
    (flat, comparable), or the stage that failed and its error."""

    values: dict | None = None
    failed: str | None = None  # "save" or "load"
    error: str = ""


def through(make, template, writer, reader) -> Outcome:
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    try:
        dcp.save(make(1), storage_writer=writer)
    except (Exception, CheckpointException) as e:
        return Outcome(failed="save", error=f"{type(e).__name__}: {e}")
    sd = template(make)
    try:
        dcp.load(sd, storage_reader=reader)
    except (Exception, CheckpointException) as e:
        return Outcome(failed="load", error=f"{type(e).__name__}: {e}")
    return Outcome(values=flat(sd))


def through_fs(make, template, path) -> Outcome:
    return through(make, template, dcp.FileSystemWriter(str(path)), dcp.FileSystemReader(str(path)))


def through_rewind(make, template, agent, job) -> tuple[Outcome, rewind.dcp.Reader]:
    """make(1) saved as step 2 over a good step 1, loaded by Reader()."""
    dcp.save({"good": torch.arange(3.0)}, storage_writer=rewind.dcp.Writer(step=1, job=job, socket=agent.socket))
    reader = rewind.dcp.Reader(job=job, socket=agent.socket)
    return through(make, template, rewind.dcp.Writer(step=2, job=job, socket=agent.socket), reader), reader


def differences(want: dict, got: dict) -> list[str]:
    def short(v):
        s = repr(v)
        return s if len(s) < 200 else s[:200] + "..."
    return [f"{k[:60]!r}: {short(got.get(k, '(none)'))} != {short(want.get(k, '(none)'))}"
            for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k)]


def assert_earlier_step_intact(agent, job) -> None:
    """A failed save of step 2 committed nothing and hides nothing: the
    job's only committed step is 1, and a load gets it."""
    with rewind.Client(socket=agent.socket, job=job) as c:
        assert sorted({s.step for s in c.list(job) if s.state == rewind.ShardState.SHARD_STATE_COMMITTED}) == [1]
    sd = {"good": torch.zeros(3)}
    reader = rewind.dcp.Reader(job=job, socket=agent.socket)
    dcp.load(sd, storage_reader=reader)
    assert reader.loaded_step == 1 and sd["good"].tolist() == [0.0, 1.0, 2.0]


def f32_case(salt: int) -> dict:
    return {"w": rand((3, 4), torch.float32, salt, 40), "v": rand((5,), torch.float32, salt, 41),
            "n": 4 * salt, "blob": io.BytesIO(b"blob %d" % salt)}


def template_of(**over) -> Callable:
    """zeros_template of the case with some keys replaced (a value of
    None: the key left out)."""
    def make_template(make):
        sd = zeros_template(make)
        for k, v in over.items():
            sd.pop(k, None)
            if v is not None:
                sd[k] = v
        return sd
    return make_template


# A load into a state dict other than the one saved: what the file system
# does (loads, converts, or fails), rewind does.
LOADS: dict[str, tuple[Callable, Callable]] = {
    "fewer_keys": (f32_case, template_of(w=None, blob=None)),
    "extra_key": (f32_case, template_of(more=torch.zeros(2))),
    "extra_object": (f32_case, template_of(more=3)),
    "to_float64": (f32_case, template_of(w=torch.zeros(3, 4, dtype=torch.float64))),
    "to_bfloat16": (f32_case, template_of(w=torch.zeros(3, 4, dtype=torch.bfloat16))),
    "to_int64": (f32_case, template_of(w=torch.zeros(3, 4, dtype=torch.int64))),
    "into_transposed": (f32_case, template_of(w=torch.zeros(4, 3).t())),
    "into_slice": (f32_case, template_of(w=torch.zeros(3, 8)[:, ::2])),
    "other_shape": (f32_case, template_of(w=torch.zeros(4, 3))),
    "fewer_dims": (f32_case, template_of(w=torch.zeros(12))),
    "object_into_tensor": (f32_case, template_of(n=torch.zeros(2))),
    "tensor_into_object": (f32_case, template_of(v=0)),
    "bytes_into_tensor": (f32_case, template_of(blob=torch.zeros(2))),
}

# States the file system fails to save: rewind fails too, at the save.
FAILS: dict[str, Callable[[int], dict]] = {
    "meta_tensor": lambda salt: {"w": torch.ones(2), "m": torch.empty(3, device="meta")},
    "unpicklable": lambda salt: {"w": torch.ones(2), "f": lambda: salt},
}

# Cases whose outcome through the file system depends on torch's
# version: rewind's is the same as the file system's.
VERSIONED: dict[str, Callable[[int], dict]] = {"int_key": int_key_case}

CASES = {**{k: (m, zeros_template) for k, m in {**SAME, **VERSIONED}.items()}, **LOADS, **{k: (m, zeros_template) for k, m in FAILS.items()}}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_as_the_file_system(case, agent, job, tmp_path):
    """Each case saved and loaded through the file system and through
    rewind (as step 2, over a good step 1): the same loaded values, bit
    for bit, or a failure at the same stage (save or load). A failed save
    leaves step 1 the job's only step. The states of SAME round-trip
    through the file system to the values saved; those of FAILS fail
    its save."""
    make, template = CASES[case]
    fs = through_fs(make, template, tmp_path)
    if case in SAME:
        assert fs.failed is None, fs.error
        assert differences(flat(make(1)), fs.values) == []
    if case in FAILS:
        assert fs.failed == "save", fs
    rw, reader = through_rewind(make, template, agent, job)
    assert (rw.failed, fs.failed) == (fs.failed, fs.failed), f"rewind: {rw.error}; file system: {fs.error}"
    if fs.failed == "save":
        assert_earlier_step_intact(agent, job)
    elif fs.failed is None:
        assert reader.loaded_step == 2
        assert differences(fs.values, rw.values) == []


def _dtypes_no_shard_holds():
    out = []
    for name in ("complex128", "complex32", "float8_e4m3fnuz", "float8_e5m2fnuz"):
        if isinstance(getattr(torch, name, None), torch.dtype):
            out.append(name)
    return out


@pytest.mark.parametrize("dtype", _dtypes_no_shard_holds())
def test_a_dtype_the_format_has_no_name_for(dtype, agent, job, tmp_path):
    """Tensors of a dtype safetensors has no name for (complex128, ...),
    whole, 0-d, transposed and, for complex ones, lazily conjugated,
    stored as their bytes: loaded the same as through the file system,
    bit for bit, as saved; and into a template of another dtype, the same
    as the file system's load converts them."""
    dt = getattr(torch, dtype)

    def make(salt):
        base = (torch.arange(15.0).reshape(3, 5) + salt).to(torch.complex128 if dt.is_complex else torch.float64)
        if dt.is_complex:
            base = base + 1j * salt
        t = base.to(dt)
        odd = {"t": t, "t0": t[1, 2].clone(), "tt": t.t()}
        if dt.is_complex:
            odd["conj"] = t.conj()
        return {"ok": rand((2,), torch.float32, salt), "odd": odd}

    fs = through_fs(make, zeros_template, tmp_path)
    if fs.failed:
        pytest.skip(f"the file system does not store {dtype} either: {fs.error}")
    assert differences(flat(make(1)), fs.values) == []
    rw, reader = through_rewind(make, zeros_template, agent, job)
    assert rw.failed is None, rw.error
    assert reader.loaded_step == 2 and differences(fs.values, rw.values) == []
    # Into a template of another dtype: converted, as the file system's
    # load converts.
    def other(make):
        return {"ok": torch.zeros(2), "odd": {"t": torch.zeros(3, 5, dtype=torch.complex64 if dt.is_complex else torch.float32)}}
    fs, rw = through_fs(make, other, tmp_path / "other"), through_rewind(make, other, agent, job)[0]
    assert (fs.failed, rw.failed) == (None, None), (fs.error, rw.error)
    assert differences(fs.values, rw.values) == []


@pytest.mark.parametrize("how", ["save", "async_save"])
def test_a_quantized_tensor_fails_the_save(how, agent, job, tmp_path):
    """A quantized tensor, which FileSystemWriter pickles with its scale
    and zero point, has no bytes a shard can hold as its values: the save
    fails naming the key and the dtype (viewed as bytes, the save crashed
    the process), and step 1 stays the job's only step."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    def make(salt):
        return {"ok": rand((2,), torch.float32, salt), "q": torch.quantize_per_tensor(torch.arange(6.0) * salt, 0.5, 0, torch.qint8)}

    fs = through_fs(make, lambda m: {"ok": torch.zeros(2)}, tmp_path)
    assert fs.failed is None, fs.error
    dcp.save({"good": torch.arange(3.0)}, storage_writer=rewind.dcp.Writer(step=1, job=job, socket=agent.socket))
    w = rewind.dcp.Writer(step=2, job=job, socket=agent.socket)
    with pytest.raises(CheckpointException) as e:
        if how == "save":
            dcp.save(make(1), storage_writer=w)
        else:
            dcp.async_save(make(1), storage_writer=w).result()
    assert "'q'" in str(e.value) and "qint8" in str(e.value), e.value
    assert_earlier_step_intact(agent, job)
