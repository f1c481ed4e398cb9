"""Save and restore through a real agent: the state comes back bit-identical."""

import math
import pathlib
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch

import rewind
from rewind import dtypes
from rewind import format as fmt

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]


def rand(dtype, shape, gen):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=gen).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(dtype)


def raw(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, so that NaNs compare equal to themselves."""
    return t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else torch.zeros(0, dtype=torch.uint8)


def assert_same(a, b, path="state"):
    """Exact equality, bit for bit for tensors (NaNs included), and types."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, path
        assert torch.equal(raw(a), raw(b)), path
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}/{i}")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == b, path


def test_every_dtype_nested(client):
    gen = torch.Generator().manual_seed(0)
    st = {"layers": [{f"{dt}".removeprefix("torch."): rand(dt, (3, 5), gen) for dt in DTYPES} for _ in range(2)],
          "scalars": {str(dt): rand(dt, (), gen) for dt in DTYPES},
          "np": np.arange(7, dtype=np.uint16), "np64": np.arange(3, dtype=np.uint64)}
    client.save(1, st)
    step, got = client.restore()
    assert step == 1
    assert_same(st, got)
    with pytest.raises(AssertionError):  # the checker itself sees a flipped bit
        bad = got["layers"][0]["float32"].clone()
        bad.view(torch.int32)[0, 0] ^= 1
        assert_same(st["layers"][0]["float32"], bad)


def test_non_contiguous_zero_size_and_plain_values(client):
    """A strided tensor alone on its storage comes back contiguous (views
    sharing one storage keep their layout: test_sharing.py)."""
    base = torch.arange(60, dtype=torch.float32).view(3, 4, 5)
    st = OrderedDict(
        transposed=base.transpose(0, 2), sliced=(base * 2)[:, 1:3, ::2], expanded=torch.ones(1, 4).expand(3, 4),
        empty=torch.zeros(0, 7), empty_bf16=torch.zeros(5, 0, dtype=torch.bfloat16), scalar=torch.tensor(2.5),
        ints=[1, -2, 2**70], floats=(0.1, float("inf"), float("nan")), strings=["", "ü<&>\n", "x" * 1000],
        none=None, flag=False, raw=b"\x00\x01", step_key={0: "a", 1: "b"})
    client.save(3, st)
    step, got = client.restore()
    assert step == 3
    for k in ("transposed", "sliced", "expanded"):
        assert torch.equal(got[k], st[k]) and got[k].is_contiguous()
    st2 = {k: (v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in st.items()}
    assert_same(OrderedDict(st2), got)


def test_model_optimizer_and_rng_state(client):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    st = {"model": model.state_dict(), "optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state(),
          "py_rng": random.getstate(), "np_rng": np.random.get_state(), "epoch": 2, "loader_pos": 1234}
    client.save(7, st)
    _, got = client.restore()
    assert_same(st, got)

    model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt2 = torch.optim.Adam(model2.parameters(), lr=1.0)
    model2.load_state_dict(got["model"])
    opt2.load_state_dict(got["optimizer"])
    torch.set_rng_state(got["torch_rng"])
    random.setstate(got["py_rng"])
    torch.manual_seed(5)
    x = torch.randn(4, 8)
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m(x).pow(2).mean().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_many_saves_reuse_slots_and_remap_on_resize(client):
    for step in range(1, 9):
        n = 1000 * (1 + step % 3)  # the size changes: the segments are resized
        client.save(step, {"w": torch.full((n,), float(step)), "n": n})
        assert client.latest() == step
    step, got = client.restore()
    assert step == 8 and torch.equal(got["w"], torch.full((got["n"],), 8.0))
    steps = sorted(s.step for s in client.list() if s.state == rewind.ShardState.SHARD_STATE_COMMITTED)
    assert steps == [7, 8]  # two slots per rank: the older ones were reused
    _, older = client.restore(step=7)
    assert older["w"][0].item() == 7.0
    with pytest.raises(rewind.NotFoundError):
        client.restore(step=3)


def test_large_state_goes_through_the_threaded_copy(client):
    gen = torch.Generator().manual_seed(2)
    st = {f"t{i}": torch.randn(((i + 1) << 20) // 4 + i, generator=gen) for i in range(6)}  # 21 MiB, odd sizes
    st["strided"] = torch.randn(1024, 1024, generator=gen).t()
    stats = client.save(1, st)
    assert stats.bytes > 24 << 20 and stats.total >= stats.copy > 0
    warm = client.save(2, st)
    warm = client.save(3, st)
    assert not warm.cold
    _, got = client.restore()
    for k in st:
        assert torch.equal(got[k], st[k]), k


def test_latest_restore_and_map_location(client):
    assert client.latest() is None
    with pytest.raises(rewind.NotFoundError, match="no committed checkpoint|no checkpoint"):
        client.restore()
    client.save(0, {"w": torch.ones(3)})
    step, got = client.restore(map_location=torch.device("cpu"))
    assert step == 0 and got["w"].device.type == "cpu"


def test_identity_from_environment(agent, job, monkeypatch):
    monkeypatch.setenv("REWIND_SOCKET", agent.socket)
    monkeypatch.setenv("REWIND_JOB", job)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    with rewind.Client() as c:
        assert (c.socket, c.job, c.rank, c.world_size) == (agent.socket, job, 2, 4)
        c.save(1, {"r": torch.tensor(c.rank)})
        shard = c.list()[0]
        assert (shard.rank, shard.world_size) == (2, 4)
    monkeypatch.setenv("REWIND_RANK", "1")
    with rewind.Client(world_size=3) as c:
        assert (c.rank, c.world_size) == (1, 3)
    for k in ("REWIND_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(k)
    with rewind.Client() as c:
        assert (c.rank, c.world_size) == (0, 1)


def test_kube_job_id_matches_go():
    """The table shm.KubeJobID is held to: both SDKs and the controller
    name a Kubernetes job alike, and every id is a valid job id."""
    table = pathlib.Path(__file__).resolve().parents[3] / "shm" / "testdata" / "kube_job_ids"
    rows = [ln.split() for ln in table.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(rows) >= 5
    for ns, name, want in rows:
        assert rewind.kube_job_id(ns, name) == want, (ns, name)
        fmt.validate_job(want)
    for ns, name in [("a.b", "c"), ("a", "b_c"), ("a", "Train"), ("a", "b/c"), ("", "b"), ("a", "x" * 254)]:
        with pytest.raises(rewind.InvalidError):
            rewind.kube_job_id(ns, name)


def test_job_from_kubernetes_environment(monkeypatch):
    from rewind import identity

    for k in ("REWIND_JOB", "REWIND_RANK", "REWIND_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(identity, "_distributed", lambda: (None, None))
    monkeypatch.setenv("REWIND_NAMESPACE", "default")
    monkeypatch.setenv("REWIND_JOB_NAME", "train")
    monkeypatch.setenv("RANK", "3")  # torchrun
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert identity.resolve(None, None, None) == ("default.train", 3, 4)
    monkeypatch.setenv("REWIND_JOB", "mine")
    assert identity.resolve(None, None, None) == ("mine", 3, 4)
    monkeypatch.delenv("REWIND_JOB")
    monkeypatch.setenv("REWIND_NAMESPACE", "Default")
    with pytest.raises(rewind.InvalidError, match="REWIND_NAMESPACE"):
        identity.resolve(None, None, None)


def test_dtype_table_covers_common_torch_types():
    for dt in DTYPES:
        assert dtypes.of_tensor(torch.zeros(1, dtype=dt)) is not None, dt


def test_identity_precedence(monkeypatch):
    from rewind import identity

    for k in ("REWIND_RANK", "REWIND_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("REWIND_JOB", "j")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert identity.resolve(None, None, None) == ("j", 1, 2)
    monkeypatch.setattr(identity, "_distributed", lambda: (3, 8))  # torch.distributed initialized
    assert identity.resolve(None, None, None) == ("j", 3, 8)
    monkeypatch.setenv("REWIND_RANK", "5")
    assert identity.resolve("other", None, None) == ("other", 5, 8)
    assert identity.resolve(None, 0, 1) == ("j", 0, 1)
    monkeypatch.setenv("REWIND_RANK", "five")
    with pytest.raises(rewind.InvalidError, match="REWIND_RANK='five' is not a number"):
        identity.resolve(None, None, None)
    monkeypatch.delenv("REWIND_JOB")
    with pytest.raises(rewind.InvalidError, match="REWIND_JOB"):
        identity.resolve(None, 0, 1)
