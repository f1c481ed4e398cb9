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
restored as one object in both places.

Tensors that share one storage (tied weights: a module's state_dict()
gives each name its own tensor object over the parameter's storage) are
stored once, and restored as tensor objects sharing one storage, as
torch.save does. The document has two more keys, each present only when
needed:

- ``"views": {NAME: {"of": BASE, "offset": N, "shape": [...], "stride":
  [...]}}``: the tensor NAME has no bytes of its own in the shard; it is
  the view of shard tensor BASE's storage at element offset N (from
  BASE's first element) with that shape and stride. Copies of one view
  (tied weights) are views of the first one's shard tensor; views at
  different offsets (the slices of a fused weight) are views of the one
  among them that covers the others, or of a 1-D shard tensor
  ``NAME.storage`` holding the span of the storage they cover. Views whose
  span is larger than their own bytes together (two rows at the ends of
  a large matrix that is not saved) are stored apart instead, without
  sharing, as are views of one storage as different dtypes and
  conjugate or negative views.
- ``"devices": {NAME: LOCATION}``: where a shard tensor was saved from,
  in torch.load's location names ("cuda:0"); tensors saved from the CPU
  are not listed. A restore's map_location is applied to these.
"""

from __future__ import annotations

import base64
import json
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from . import dtypes
from .errors import InvalidError, RewindError

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
    doc: dict = {"format": OBJECTS_FORMAT, "tree": f.node(state, ())}
    leaves, views, devices = _share(f.leaves, f.name)
    if views:
        doc["views"] = views
    if devices:
        doc["devices"] = devices
    return leaves, json.dumps(doc, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


class _Flattener:
    def __init__(self):
        self.leaves: list[Leaf] = []  # every tensor object and array once, in the order met
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

    def name(self, path: tuple | str) -> str:
        base = path if isinstance(path, str) else "/".join(path) or "tensor"
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


def _storage_key(t: torch.Tensor):
    """What identifies the memory a tensor views, or None for a tensor
    that shares with nothing (no bytes, a subclass, a lazy conjugate or
    negation: same storage, other values)."""
    if type(t) is not torch.Tensor or t.numel() == 0 or t.is_conj() or t.is_neg():
        return None
    untyped = getattr(t, "untyped_storage", None)  # torch 2; 1.x has only the typed storage()
    ptr = (untyped() if untyped is not None else t.storage()).data_ptr()
    return (t.device, ptr, t.dtype) if ptr else None


def extent(t: torch.Tensor) -> int:
    """Elements of storage from t's first element to past its last."""
    return 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))


def _contiguous_stride(shape) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return out[::-1]


def _location(dev: torch.device) -> str:
    """A device's name as torch.save records it ("cpu", "cuda:0")."""
    if dev.type == "cuda" and dev.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(dev)


def _share(leaves: list[Leaf], name) -> tuple[list[Leaf], dict, dict]:
    """Stores the tensors sharing a storage once: returns the shard's
    tensors, the views document and the devices document."""
    groups: dict[object, list[Leaf]] = {}
    for lf in leaves:
        key = _storage_key(lf.value) if isinstance(lf.value, torch.Tensor) else None
        if key is not None:
            groups.setdefault(key, []).append(lf)
    views: dict[str, dict] = {}
    at_first: dict[str, Leaf] = {}  # a group's shard tensor, in place of its first member
    shared: set[str] = set()  # members of those groups
    for g in groups.values():
        if len(g) > 1 and (base := _store_group(g, views, name)) is not None:
            at_first[g[0].name] = base
            shared.update(lf.name for lf in g)
    out = [at_first.get(lf.name, lf) for lf in leaves if lf.name in at_first or lf.name not in shared]
    devices = {lf.name: _location(lf.value.device) for lf in out
               if isinstance(lf.value, torch.Tensor) and lf.value.device.type != "cpu"}
    return out, views, devices


def _store_group(g: list[Leaf], views: dict, name) -> Leaf | None:
    """The shard tensor holding the storage that g's tensors view, filling
    views for those that become views of it (all but one, or all); None
    when they are better stored apart."""
    ts = [cast(torch.Tensor, lf.value) for lf in g]
    if len({(t.storage_offset(), tuple(t.shape), t.stride()) for t in ts}) == 1:  # tied weights
        for lf in g[1:]:
            views[lf.name] = {"of": g[0].name, "offset": 0, "shape": list(lf.shape),
                              "stride": _contiguous_stride(lf.shape)}
        return g[0]
    lo = min(t.storage_offset() for t in ts)
    hi = max(t.storage_offset() + extent(t) for t in ts)
    if hi - lo > sum(t.numel() for t in ts):
        return None  # the span is larger than the views: sharing would store more
    i = next((i for i, t in enumerate(ts) if t.is_contiguous() and t.storage_offset() == lo and t.numel() == hi - lo), -1)
    base = g[i] if i >= 0 else Leaf(name(g[0].name + ".storage"), ts[0].as_strided((hi - lo,), (1,), lo),
                                    g[0].dtype, (hi - lo,))
    for lf, t in zip(g, ts):
        if lf is not base:
            views[lf.name] = {"of": base.name, "offset": t.storage_offset() - lo, "shape": list(t.shape),
                              "stride": list(t.stride())}
    return base


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
    try:
        doc = json.loads(objects)
    except ValueError:
        return None  # not this SDK's: unflatten reports it
    if isinstance(doc, dict) and doc.get("format") == OBJECTS_FORMAT and "tree" in doc:
        return doc
    return None


def devices(objects: str | None) -> dict[str, str]:
    """Where each shard tensor was saved from, when not the CPU."""
    doc = _doc(objects)
    d = doc.get("devices") if doc is not None else None
    return {str(k): str(v) for k, v in d.items()} if isinstance(d, dict) else {}


def unflatten(objects: str | None, tensors: dict, op: str = "restore"):
    """Rebuilds the nest given to flatten. A shard not written by this SDK
    (the Go SDK's, say) comes back as {name: tensor}, plus its objects
    document parsed under "__objects__" if it has one."""
    try:
        doc = _doc(objects)
        if doc is None:
            state = dict(tensors)
            if objects is not None:
                state["__objects__"] = json.loads(objects)
            return state
        return _Builder(tensors, doc.get("views") or {}).node(doc["tree"])
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
        raise RewindError(op, f"the shard's objects document does not fit its tensors ({type(e).__name__}: {e}); "
                          "written by a newer SDK?") from None


class _Builder:
    def __init__(self, tensors: dict, views: dict):
        self.tensors = tensors
        self.views = views
        self.built: dict[str, torch.Tensor] = {}  # one object per view name, however often it appears

    def node(self, n):
        if not isinstance(n, dict):
            return n
        tag, v = next(iter(n.items()))
        if tag == "tensor":
            return self.tensor(v)
        if tag == "ndarray":
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

    def tensor(self, name: str):
        if name in self.tensors:
            return self.tensors[name]
        if name not in self.built:
            self.built[name] = self.view(name, self.views[name])
        return self.built[name]

    def view(self, name: str, spec: dict) -> torch.Tensor:
        base = self.tensors[spec["of"]]
        shape, stride, off = [int(x) for x in spec["shape"]], [int(x) for x in spec["stride"]], int(spec["offset"])
        if not isinstance(base, torch.Tensor):
            raise TypeError(f"view {name!r} of {spec['of']!r}, which is not a torch tensor")
        end = off + (1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0)
        if len(shape) != len(stride) or off < 0 or min(stride, default=0) < 0 or end > base.numel():
            raise ValueError(f"view {name!r} {shape}/{stride} at {off} does not fit in {spec['of']!r} ({base.numel()} elements)")
        return base.as_strided(shape, stride, base.storage_offset() + off)


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
