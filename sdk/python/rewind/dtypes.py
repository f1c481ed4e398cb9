"""Element types: safetensors names, their sizes, and torch/numpy equivalents."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

# Size in bytes of every dtype a shard may hold (shm/dtype.go).
SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "F64": 8, "I64": 8, "U64": 8, "C64": 8,
}


@functools.lru_cache(maxsize=None)
def _torch_map() -> dict[str, torch.dtype]:
    """safetensors name -> torch.dtype, for the types this torch has. torch
    is imported here, on first use, so that ``import rewind`` does not."""
    import torch

    names = {
        "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32",
        "I64": "int64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
        "F64": "float64", "C64": "complex64", "U16": "uint16", "U32": "uint32",
        "U64": "uint64", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
    }
    # Older torch lacks the unsigned and float8 types: map only what exists.
    return {st: getattr(torch, n) for st, n in names.items() if isinstance(getattr(torch, n, None), torch.dtype)}


@functools.lru_cache(maxsize=None)
def _from_torch() -> dict[torch.dtype, str]:
    return {v: k for k, v in _torch_map().items()}


def __getattr__(name: str) -> Any:
    # TORCH (safetensors name -> torch.dtype) and FROM_TORCH, built when
    # first read (PEP 562).
    if name == "TORCH":
        return _torch_map()
    if name == "FROM_TORCH":
        return _from_torch()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

NUMPY = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype("<u1"), "I8": np.dtype("<i1"),
    "I16": np.dtype("<i2"), "U16": np.dtype("<u2"), "F16": np.dtype("<f2"),
    "I32": np.dtype("<i4"), "U32": np.dtype("<u4"), "F32": np.dtype("<f4"),
    "I64": np.dtype("<i8"), "U64": np.dtype("<u8"), "F64": np.dtype("<f8"),
    "C64": np.dtype("<c8"),
}
"""safetensors name -> numpy dtype (little-endian; numpy has no BF16)."""
FROM_NUMPY = {v: k for k, v in NUMPY.items()}


def of_tensor(t: torch.Tensor) -> str | None:
    """The safetensors name of a tensor's dtype, or None if it has none."""
    return _from_torch().get(t.dtype)


def of_ndarray(a: np.ndarray) -> str | None:
    """The safetensors name of an array's dtype (native or little-endian)."""
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == "=" else a.dtype
    return FROM_NUMPY.get(dt)


def num_bytes(dtype: str, shape) -> int:
    n = SIZES[dtype]
    for d in shape:
        n *= d
    return n
