"""Flattening a nest of dicts, lists and tuples of tensors and plain Python
values into named tensors plus a JSON document of everything else.

The document (the shard's ``rewind.objects`` metadata) is
``{"format": "rewind.python/1", "tree": NODE}`` where a NODE is:

- a JSON null, boolean, number or string: that Python value;
- ``{"tensor": NAME}``: the torch tensor stored under NAME in the shard;
- ``{"ndarray": NAME}``: a numpy array stored under NAME;
- ``{"dict": [[KEY, NODE], ...]}``, ``{"odict": [...], "meta": NODE}``
  (an OrderedDict and the ``_metadata`` a module's state_dict carries):
  keys are NODEs too, so int keys (an optimizer's state) stay ints;
- ``{"list": [NODE, ...]}``, ``{"tuple": [NODE, ...]}``;
- ``{"float": "nan" | "inf" | "-inf"}``, ``{"bytes": BASE64}``,
  ``{"npscalar": DTYPE, "value": NODE}``, ``{"torch_dtype": NAME}``,
  ``{"device": NAME}``.

Tensor names are the path of keys to the tensor joined by "/" (for example
``model/fc1.weight`` or ``optimizer/state/0/exp_avg``), made unique when two
paths print alike. A tensor object that appears twice is stored once and
restored as one object in both places, as tied weights are.
"""

from __future__ import annotations

import base64
import json
import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from . import dtypes
from .errors import InvalidError

OBJECTS_FORMAT = "rewind.python/1"


@dataclass
class Leaf:
    """A tensor or numpy array to store under name."""

    name: str
    value: object  # torch.Tensor or np.ndarray
    dtype: str  # safetensors dtype name
    shape: tuple


def flatten(state) -> tuple[list[Leaf], bytes]:
    """Returns the tensors of state and the JSON document of the rest."""
    f = _Flattener()
    doc = {"format": OBJECTS_FORMAT, "tree": f.node(state, ())}
    return f.leaves, json.dumps(doc, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


class _Flattener:
    def __init__(self):
        self.leaves: list[Leaf] = []
        self.names: set[str] = set()
        self.by_id: dict[int, str] = {}

    def node(self, v, path: tuple):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, torch.Tensor):
            return {"tensor": self.tensor(v, path)}
        if isinstance(v, np.ndarray):
            return {"ndarray": self.ndarray(v, path)}
        if isinstance(v, np.generic):
            return {"npscalar": v.dtype.str, "value": self.node(v.item(), path)}
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            return float(v) if math.isfinite(v) else {"float": repr(float(v))}
        if isinstance(v, (bytes, bytearray)):
            return {"bytes": base64.b64encode(bytes(v)).decode()}
        if isinstance(v, dict):
            return self.mapping(v, path)
        if isinstance(v, (list, tuple)):
            items = [self.node(x, path + (str(i),)) for i, x in enumerate(v)]
            return {"tuple" if isinstance(v, tuple) else "list": items}
        if isinstance(v, torch.dtype):
            return {"torch_dtype": str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {"device": str(v)}
        raise InvalidError("save", f"cannot save {type(v).__module__}.{type(v).__qualname__} at "
                           f"{'/'.join(path) or 'the top'}: only tensors, numpy arrays, dicts, lists, tuples "
                           "and None/bool/int/float/str/bytes values can be saved")

    def mapping(self, v: dict, path: tuple):
        pairs = [[self.key(k, path), self.node(x, path + (str(k),))] for k, x in v.items()]
        if not isinstance(v, OrderedDict):
            return {"dict": pairs}
        out = {"odict": pairs}
        meta = getattr(v, "_metadata", None)  # a module's state_dict() carries one
        if meta is not None:
            out["meta"] = self.node(meta, path + ("_metadata",))
        return out

    def key(self, k, path: tuple):
        if isinstance(k, (torch.Tensor, np.ndarray)):
            raise InvalidError("save", f"a tensor is a dict key at {'/'.join(path) or 'the top'}")
        return self.node(k, path)

    def name(self, path: tuple) -> str:
        base = "/".join(path) or "tensor"
        base = base.encode("utf-8", "replace").decode("utf-8")  # lone surrogates
        name, i = base, 1
        while name in self.names or name == "__metadata__":
            i += 1
            name = f"{base}~{i}"
        self.names.add(name)
        return name

    def tensor(self, t: torch.Tensor, path: tuple) -> str:
        if id(t) in self.by_id:
            return self.by_id[id(t)]
        where = "/".join(path) or "the top"
        dt = dtypes.of_tensor(t)
        if dt is None:
            raise InvalidError("save", f"tensor at {where} has dtype {t.dtype}, which a shard cannot hold")
        if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
            raise InvalidError("save", f"tensor at {where} is {t.layout}/{t.device.type}: only dense tensors with data can be saved")
        name = self.name(path)
        self.by_id[id(t)] = name
        self.leaves.append(Leaf(name, t.detach(), dt, tuple(t.shape)))
        return name

    def ndarray(self, a: np.ndarray, path: tuple) -> str:
        if id(a) in self.by_id:
            return self.by_id[id(a)]
        dt = dtypes.of_ndarray(a)
        if dt is None:
            raise InvalidError("save", f"array at {'/'.join(path) or 'the top'} has dtype {a.dtype}, which a shard cannot hold")
        name = self.name(path)
        self.by_id[id(a)] = name
        self.leaves.append(Leaf(name, a, dt, tuple(a.shape)))
        return name


def numpy_names(objects: str | None) -> set[str]:
    """Names of the tensors the document says are numpy arrays."""
    doc = _doc(objects)
    out: set[str] = set()

    def walk(n):
        if isinstance(n, dict):
            if "ndarray" in n:
                out.add(n["ndarray"])
            for v in n.values():
                walk(v)
        elif isinstance(n, list):
            for v in n:
                walk(v)

    if doc is not None:
        walk(doc["tree"])
    return out


def _doc(objects: str | None):
    if objects is None:
        return None
    doc = json.loads(objects)
    if isinstance(doc, dict) and doc.get("format") == OBJECTS_FORMAT and "tree" in doc:
        return doc
    return None


def unflatten(objects: str | None, tensors: dict):
    """Rebuilds the nest given to flatten. A shard not written by this SDK
    (the Go SDK's, say) comes back as {name: tensor}, plus its objects
    document parsed under "__objects__" if it has one."""
    doc = _doc(objects)
    if doc is None:
        state = dict(tensors)
        if objects is not None:
            state["__objects__"] = json.loads(objects)
        return state
    return _Builder(tensors).node(doc["tree"])


class _Builder:
    def __init__(self, tensors: dict):
        self.tensors = tensors

    def node(self, n):
        if not isinstance(n, dict):
            return n
        tag, v = next(iter(n.items()))
        if tag in ("tensor", "ndarray"):
            return self.tensors[v]
        if tag == "dict":
            return {self.node(k): self.node(x) for k, x in v}
        if tag == "odict":
            od = OrderedDict((self.node(k), self.node(x)) for k, x in v)
            if "meta" in n:  # as a module's state_dict() carries it
                setattr(od, "_metadata", self.node(n["meta"]))
            return od
        if tag in ("list", "tuple"):
            items = [self.node(x) for x in v]
            return items if tag == "list" else tuple(items)
        return _scalar(tag, v, n, self)


def _scalar(tag, v, n, b: _Builder):
    if tag == "float":
        return float(v)
    if tag == "bytes":
        return base64.b64decode(v)
    if tag == "npscalar":
        return np.dtype(v).type(b.node(n["value"]))
    if tag == "torch_dtype":
        return getattr(torch, v)
    if tag == "device":
        return torch.device(v)
    raise ValueError(f"unknown node {tag!r} in the objects document")
