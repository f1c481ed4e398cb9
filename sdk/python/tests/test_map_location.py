"""restore's map_location takes what torch.load's does: a device name, a
torch.device, None, a dict from saved location to location, a callable;
one the SDK cannot honour is a RewindError naming the problem."""

import json

import numpy as np
import pytest
import torch

import rewind
from rewind import checksum, state
from rewind import format as fmt

CUDA = torch.cuda.is_available()


def sample():
    w = torch.arange(6.0).view(2, 3)
    return {"w": w, "wt": w.t(), "b": torch.ones(4, dtype=torch.bfloat16), "n": np.arange(3)}


def check(got, st, device="cpu"):
    for k in ("w", "wt", "b"):
        assert got[k].device.type == device and torch.equal(got[k].cpu(), st[k]), k
    assert isinstance(got["n"], np.ndarray) and (got["n"] == st["n"]).all()


class Recorder:
    """A callable map_location that keeps what it was given."""

    def __init__(self, result=lambda storage, location: storage):
        self.calls = []
        self.result = result

    def __call__(self, storage, location):
        self.calls.append((type(storage).__name__, storage.device.type, storage.nbytes(), location))
        return self.result(storage, location)


def test_each_kind_of_map_location(client):
    st = sample()
    client.save(1, st)
    kinds = ["cpu", torch.device("cpu"), None, {"cpu": "cpu"}, {"cuda:0": "cpu"}, {torch.device("cpu"): torch.device("cpu")},
             lambda storage, location: storage, lambda storage, location: None]
    for ml in kinds:
        _, got = client.restore(map_location=ml)
        check(got, st)
    rec = Recorder()
    _, got = client.restore(map_location=rec)
    check(got, st)
    # Once per stored storage (w and its transpose share one), on the CPU, with its saved location.
    assert sorted(rec.calls) == [("UntypedStorage", "cpu", 8, "cpu"), ("UntypedStorage", "cpu", 24, "cpu")]
    assert got["wt"].data_ptr() == got["w"].data_ptr()
    if CUDA:
        for ml in ("cuda", torch.device("cuda:0"), {"cpu": "cuda:0"}, lambda storage, location: storage.cuda(0)):
            check(client.restore(map_location=ml)[1], st, "cuda")


CPU_ONLY = [("cuda", "no CUDA device"), (torch.device("cuda:0"), "no CUDA device"),
            ({"cpu": "cuda:0"}, "saved on cpu, which map_location maps to cuda:0, and this process has no CUDA"),
            (lambda storage, location: storage.cuda(), r"map_location\('cpu'\) for tensor 'w' raised")]
ALWAYS = [("gpu", rewind.InvalidError, "'gpu', which is not a device"),
          ("meta", rewind.InvalidError, "meta, a device without data"),
          (5, rewind.InvalidError, "map_location 5 .* must be a device"),
          ({"cpu": 7}, rewind.InvalidError, "dict entry 'cpu': 7"),
          (lambda storage, location: 5, rewind.InvalidError, "returned int for tensor 'w', not a storage"),
          (lambda storage, location: torch.UntypedStorage(3), rewind.InvalidError, "storage of 3 bytes for tensor 'w'"),
          (lambda storage, location: 1 // 0, rewind.RewindError, "raised ZeroDivisionError")]


def test_map_location_that_cannot_be_honoured(client):
    st = sample()
    client.save(1, st)
    cases = ALWAYS + ([(ml, rewind.RewindError, msg) for ml, msg in CPU_ONLY] if not CUDA else [])
    for ml, kind, msg in cases:
        with pytest.raises(rewind.RewindError, match=msg) as e:
            client.restore(map_location=ml)
        assert type(e.value) is kind, (ml, e.value)
        assert "restore" in str(e.value)
    step, got = client.restore()  # nothing was damaged
    assert step == 1
    check(got, st)


def gpu_shard(path, st, devices):
    """A shard as a rank whose tensors were on GPUs writes it (the
    objects document says where each was saved from), for a test on a
    machine without one."""
    leaves, objects = state.flatten(st)
    doc = json.loads(objects)
    doc["devices"] = devices
    specs = [fmt.TensorInfo(lf.name, lf.dtype, lf.shape) for lf in leaves]
    layout = fmt.Layout(fmt.ShardMeta("gpu-job", 0, 1, 9), specs, json.dumps(doc).encode())
    buf = bytearray(layout.size)
    values = {lf.name: lf.value for lf in leaves}
    for i, t in enumerate(layout.tensors):
        b = np.ascontiguousarray(values[t.name].contiguous().view(torch.uint8).numpy()).tobytes()
        buf[layout.data_start + t.begin : layout.data_start + t.end] = b
        layout.set_sum(i, checksum.tree_sum(b))
    buf[: layout.data_start] = layout.header
    path.write_bytes(bytes(buf))
    return str(path)


def test_map_location_of_tensors_saved_on_gpus(tmp_path):
    st = {"w": torch.arange(6.0), "x": torch.ones(2), "c": torch.zeros(3)}
    path = gpu_shard(tmp_path / "gpu.safetensors", st, {"w": "cuda:0", "x": "cuda:1"})  # c: saved from the CPU
    for ml in ("cpu", {"cuda:0": "cpu", "cuda:1": "cpu"}):
        step, got = rewind.load_state(path, map_location=ml)
        assert step == 9 and all(got[k].device.type == "cpu" and torch.equal(got[k], st[k]) for k in st)
    rec = Recorder()
    _, got = rewind.load_state(path, map_location=rec)
    assert sorted(c[3] for c in rec.calls) == ["cpu", "cuda:0", "cuda:1"]
    assert all(got[k].device.type == "cpu" for k in st)
    if CUDA:
        return
    for ml, msg in [(None, "tensor 'w' was saved on cuda:0, where map_location leaves it"),
                    ({"cuda:0": "cpu"}, "tensor 'x' was saved on cuda:1, where map_location leaves it"),
                    (lambda storage, location: None, "'w' was saved on cuda:0, where map_location returned None")]:
        with pytest.raises(rewind.RewindError, match=msg) as e:
            rewind.load_state(path, map_location=ml)
        assert "no CUDA device" in str(e.value) and str(path) in str(e.value)
