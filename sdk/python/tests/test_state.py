"""Flattening nests into tensors plus a JSON document, without an agent."""

import json
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch

from rewind import InvalidError, state


def roundtrip(obj):
    leaves, doc = state.flatten(obj)
    json.loads(doc)  # strict JSON: no NaN literals
    assert b"NaN" not in doc and b"Infinity" not in doc
    return state.unflatten(doc.decode(), {lf.name: lf.value for lf in leaves}), leaves


def test_plain_values_keep_their_types():
    obj = {"i": 3, "big": 2**80, "f": 1.0, "nan": math.nan, "inf": -math.inf, "s": "ü<&>", "n": None,
           "b": True, "bytes": b"\x00\xff", "t": (1, (2, [3])), 7: "int key", (1, "a"): "tuple key",
           None: "none key", 2.5: "float key"}
    got, leaves = roundtrip(obj)
    assert leaves == []
    assert math.isnan(got.pop("nan")) and math.isnan(obj.pop("nan"))
    assert got == obj
    assert type(got["f"]) is float and type(got["i"]) is int and type(got["t"]) is tuple


def test_ordered_dict_and_module_metadata():
    sd = torch.nn.BatchNorm1d(3).state_dict()
    got, leaves = roundtrip(sd)
    assert isinstance(got, OrderedDict)
    assert list(got) == list(sd)
    assert got._metadata == sd._metadata
    assert [lf.name for lf in leaves] == list(sd)


def test_names_follow_paths_and_stay_unique():
    t = torch.zeros(1)
    leaves, _ = state.flatten({"a": {"b": [t.clone(), t.clone()]}, 0: t.clone(), "0": t.clone(),
                               "__metadata__": t.clone()})
    names = [lf.name for lf in leaves]
    assert names[:2] == ["a/b/0", "a/b/1"]
    assert len(set(names)) == len(names)
    assert "__metadata__" not in names
    leaves, _ = state.flatten(torch.ones(2))
    assert [lf.name for lf in leaves] == ["tensor"]


def test_shared_tensor_is_stored_once_and_restored_shared():
    w = torch.randn(4)
    got, leaves = roundtrip({"enc": w, "dec": w, "other": w.clone()})
    assert len(leaves) == 2
    assert got["enc"] is got["dec"] and got["other"] is not got["enc"]


def test_numpy_values():
    rng = np.random.RandomState(3)
    obj = {"np_rng": rng.get_state(), "i": np.int64(5), "f": np.float32(1.5), "b": np.bool_(True)}
    got, leaves = roundtrip(obj)
    assert [lf.dtype for lf in leaves] == ["U32"]
    assert got["np_rng"][0] == "MT19937" and got["np_rng"][1] is obj["np_rng"][1]
    assert type(got["i"]) is np.int64 and got["i"] == 5
    assert type(got["f"]) is np.float32 and type(got["b"]) is np.bool_


def test_torch_dtype_and_device_values():
    got, _ = roundtrip({"dt": torch.bfloat16, "dev": torch.device("cpu")})
    assert got == {"dt": torch.bfloat16, "dev": torch.device("cpu")}


@pytest.mark.parametrize("bad", [object(), {1, 2}, lambda: 0, torch.zeros(2).to_sparse(),
                                 torch.zeros(2, dtype=torch.complex128)])
def test_unsupported_values_are_invalid(bad):
    with pytest.raises(InvalidError, match="x/1"):
        state.flatten({"x": [0, bad]})


def test_foreign_document_comes_back_flat():
    t = {"w": torch.ones(1)}
    assert state.unflatten(None, t) == t
    got = state.unflatten('{"from":"go"}', t)
    assert got["__objects__"] == {"from": "go"} and got["w"] is t["w"]
