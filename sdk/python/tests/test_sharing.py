"""Tensors sharing one storage (tied weights, slices of a fused weight) are
stored once and restored as tensors sharing one storage, as torch.save does."""

import json

import numpy as np
import torch

import rewind
from rewind import shard


def storage_ptr(t: torch.Tensor) -> int:
    untyped = getattr(t, "untyped_storage", None)  # torch 2; 1.x: storage()
    return (untyped() if untyped is not None else t.storage()).data_ptr()


def stored(client: rewind.Client):
    """The latest committed shard: its path, header and objects document."""
    sh = max((s for s in client.list() if s.state == rewind.ShardState.SHARD_STATE_COMMITTED), key=lambda s: s.seq)
    with open(sh.path, "rb") as f:
        h = shard.decode_header(f.read())
    return sh.path, h, json.loads(h.objects)


def data_bytes(h) -> int:
    return sum(t.nbytes for t in h.tensors)


class TiedLM(torch.nn.Module):
    """An embedding tied to the output layer, as language models have it."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 64)
        self.body = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 1000, bias=False)
        self.head.weight = self.emb.weight


def test_tied_weights_stored_once_restored_sharing_storage(client):
    torch.manual_seed(0)
    model = TiedLM()
    sd = model.state_dict()
    # state_dict() gives each name its own tensor object over one storage.
    assert sd["emb.weight"] is not sd["head.weight"]
    assert storage_ptr(sd["emb.weight"]) == storage_ptr(sd["head.weight"])
    stats = client.save(1, {"model": sd, "step": 1})

    path, h, doc = stored(client)
    every = sum(t.numel() * t.element_size() for t in sd.values())
    tied = sd["emb.weight"].numel() * sd["emb.weight"].element_size()
    assert data_bytes(h) == every - tied  # the storage counted once
    assert stats.bytes == h.size  # and the size the SDK reports is the shard's
    assert {t.name for t in h.tensors} == {"model/emb.weight", "model/body.weight", "model/body.bias"}
    assert doc["views"] == {"model/head.weight": {"of": "model/emb.weight", "offset": 0, "shape": [1000, 64],
                                                  "stride": [64, 1]}}

    for _, got in (client.restore(), rewind.load_state(path)):
        g = got["model"]
        assert list(g) == list(sd)
        emb, head = g["emb.weight"], g["head.weight"]
        assert emb is not head and storage_ptr(emb) == storage_ptr(head)
        assert torch.equal(emb, sd["emb.weight"]) and torch.equal(head, sd["head.weight"])
        emb[0, 0] += 1  # one memory: a change through one name shows through the other
        assert head[0, 0] == emb[0, 0]

    fresh = TiedLM()
    fresh.load_state_dict(client.restore()[1]["model"])
    assert fresh.head.weight is fresh.emb.weight and torch.equal(fresh.emb.weight, model.emb.weight)


def test_views_at_different_offsets_share_one_storage(client):
    torch.manual_seed(1)
    fused = torch.randn(3 * 16, 8)  # a fused q/k/v weight and views of it
    q, k, v = fused.split(16)
    st = {"qkv": fused, "q": q, "k": k, "v": v, "col": fused[:, 3], "qkv_t": fused.t()}
    client.save(1, st)
    _, h, doc = stored(client)
    assert [t.name for t in h.tensors] == ["qkv"] and data_bytes(h) == fused.numel() * 4
    assert doc["views"]["k"] == {"of": "qkv", "offset": 16 * 8, "shape": [16, 8], "stride": [8, 1]}

    _, got = client.restore()
    for name, t in st.items():
        r = got[name]
        assert torch.equal(r, t), name
        assert storage_ptr(r) == storage_ptr(got["qkv"]), name
        assert (r.storage_offset(), r.stride()) == (t.storage_offset(), t.stride()), name
    got["qkv"][20, 3] = 99.0
    assert got["k"][4, 3] == 99.0 and got["col"][20] == 99.0 and got["qkv_t"][3, 20] == 99.0


def test_overlapping_slices_without_their_base(client):
    """Two views, neither covering the other: the span of storage they
    cover is stored once, under a name of its own."""
    base = torch.arange(100.0)
    st = {"x": base[:60], "y": base[40:]}
    client.save(1, st)
    _, h, doc = stored(client)
    assert [(t.name, t.shape) for t in h.tensors] == [("x.storage", (100,))]
    assert set(doc["views"]) == {"x", "y"}
    _, got = client.restore()
    assert torch.equal(got["x"], st["x"]) and torch.equal(got["y"], st["y"])
    assert storage_ptr(got["x"]) == storage_ptr(got["y"])
    got["x"][50] = -1.0
    assert got["y"][10] == -1.0


def test_what_is_stored_apart(client):
    """Sharing that would store more than the views hold, views of one
    storage as other dtypes, and conjugate views are stored apart; one
    tensor object appearing several times is one object."""
    torch.manual_seed(2)
    big = torch.arange(10000.0)
    t = torch.randn(8)
    c = torch.randn(4, dtype=torch.complex64)
    st = {"first": big[:2], "last": big[-2:], "f": t, "i": t.view(torch.int32), "c": c, "cj": c.conj(),
          "again": [t, t], "np": np.arange(3)}
    client.save(1, st)
    _, h, doc = stored(client)
    assert {t.name for t in h.tensors} == {"first", "last", "f", "i", "c", "cj", "np"}
    assert data_bytes(h) == 2 * 4 + 2 * 4 + 8 * 4 + 8 * 4 + 4 * 8 * 2 + 3 * 8
    assert "views" not in doc and "devices" not in doc
    _, got = client.restore()
    for name in ("first", "last", "f", "i", "c"):
        assert torch.equal(got[name], st[name]), name
    assert torch.equal(got["cj"], c.conj().resolve_conj())
    assert storage_ptr(got["f"]) != storage_ptr(got["i"])
    assert got["again"][0] is got["f"] and got["again"][1] is got["f"]
